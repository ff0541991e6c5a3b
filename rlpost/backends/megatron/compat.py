"""megatron-core on CPU: the places where megatron-core 0.16 asks for CUDA, redirected to CPU.

Everything here but the last section is inactive on a machine with CUDA (`cpu_compat()` is then
a no-op), and all of it refuses any megatron-core other than 0.16.x. What each piece does, and
when it can go:

- `_CpuDevices`, a torch function mode active only inside `cpu_compat()`:
  * device arguments naming CUDA (`device='cuda'`, a CUDA index, `.cuda()`, `.to('cuda')`)
    become CPU: layers, p2p buffers, the param/grad buffers of
    DistributedDataParallel, the optimizer's scale tensors and grad clipping allocate there;
  * `pin_memory=True` is dropped (pinning needs an accelerator);
  * `Tensor.type()` reports 'torch.cuda.<T>Tensor' for CPU tensors, because the optimizers
    and `clip_grads` assert that main grads and params are CUDA tensors;
  Can go when megatron-core allocates on a configurable device (not the case up to 0.16).
- `_CUDA_STAND_INS`: `torch.cuda.current_device` answers the CPU device,
  `synchronize/empty_cache/current_stream/default_stream/stream/Stream/Event` are no-ops, and
  `torch.cuda.get_rng_state/set_rng_state/manual_seed` act on the CPU generator. Installed on
  entry and restored on exit. Same lifetime as the mode above.
- torch.compile is disabled inside `cpu_compat()`: megatron's `jit_fuser` wraps small
  element-wise functions (MoE activations, router bias) in torch.compile, whose first call
  compiles with inductor on CPU (~25 s per process) for no speed-up at these sizes. Can go
  when megatron-core's fuser can be turned off before its modules are imported.
- `CpuRNGStatesTracker` replaces megatron's CUDA RNG tracker (tensor_parallel/random.py) with
  the same named-state forking over torch's CPU generator; `model_parallel_cpu_manual_seed`
  seeds it and the CPU generator (megatron's seed call leaves the latter alone). Can go when
  the tracker accepts a device.
- `CpuMemoryBuffer` replaces parallel_state's GlobalMemoryBuffer (its get_tensor allocates on
  the current CUDA device). Can go with the first bullet.
- `token_dispatcher.maybe_move_tensor_to_cpu`: the all-to-all dispatcher moves its split
  sizes to host numpy arrays only when they are CUDA tensors; on CPU they stay tensors, which
  `all_to_all_single` rejects. The stand-in converts CPU tensors too. Same lifetime as
  `_CpuDevices`.
- `tensor_parallel.random._get_cuda_rng_state/_set_cuda_rng_state` act on the CPU generator:
  activation recomputation saves and restores the RNG state around each checkpointed block
  (so dropout repeats itself), through torch.cuda.random directly. Same lifetime.

These apply on any machine, CUDA or not, and are equally version-gated:
- `install_te_fallbacks()`, once per process from `init_parallel`, for a machine without
  TransformerEngine (every CPU one, and GPU ones without it):
  * `moe_utils.te_general_gemm = None`: megatron-core 0.16 leaves the name undefined when
    TransformerEngine is absent, so the MoE router's gating linear raises NameError; None
    selects its torch path. Can go when megatron-core defines the fallback.
  * `multi_latent_attention.HAVE_TE = False`: 0.16's import guard succeeds without TE (the
    extension module imports with mocks in TE's place) and MLA's constructor then calls
    isinstance(..., <mock>). Can go with the same upstream fix.
  * `DistributedOptimizer._set_main_param_and_optimizer_states` keeps torch Adam's live
    `step` when a fully_reshardable checkpoint's state (which leaves `step` out) is copied in;
    without Apex or TE only. Can go when megatron-core copies by the saved keys.
  * with or without TE: `multi_latent_attention.apply_rotary_pos_emb` is
    `kernels.packed_mla_rope`, which rotates a packed micro-batch of rlpost's by the positions
    its cu_seqlens carry instead of reading cu_seqlens on the host for q and k in every layer
    (megatron-core's unfused THD RoPE, which rlpost selects: apply_rope_fusion is off); every
    other call goes to megatron-core's function. Can go when megatron-core's MLA takes
    per-token positions.
- `untie_adam_steps(optimizer)` after loading a distributed-optimizer checkpoint: without Apex
  or TransformerEngine (torch's own AdamW) megatron-core 0.16 restores every parameter's Adam
  `step` as one shared tensor, which torch's foreach AdamW then increments once per parameter
  per step (wrong bias correction from the second step on). Each state gets its own copy.
  Can go when megatron-core clones the step per state.
- `in_process_checkpoint_writes()`: dist_checkpointing's torch_dist writer collects its
  results through a multiprocessing Manager queue that it *spawns* (a fresh interpreter that
  re-imports `__main__`: seconds per save, and a crash in scripts without a main guard). Our
  saves are synchronous, so the results never leave this process and a plain queue serves.
  Can go when megatron-core creates that queue only for asynchronous saves.
  Without psutil (not among megatron-core's declared dependencies) the writer's worker raises
  while logging its memory use and the save hangs; the log figure becomes 0.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._dynamo
from torch.overrides import TorchFunctionMode

from rlpost.backends.host_reads import CURRENT_DEVICE_ON_CPU

SUPPORTED_MEGATRON = (0, 16)


def megatron_version() -> tuple[int, int, int]:
    from megatron.core import package_info

    return (package_info.MAJOR, package_info.MINOR, package_info.PATCH)


def check_megatron_version() -> None:
    """Refuse a megatron-core this layer was not written against."""
    found = megatron_version()
    if found[:2] != SUPPORTED_MEGATRON:
        wanted = ".".join(map(str, SUPPORTED_MEGATRON))
        raise RuntimeError(
            f"megatron-core {'.'.join(map(str, found))} is installed, but rlpost's Megatron "
            f"backend (its CPU layer, layer specs and weight names) is written for {wanted}.x; "
            f"install megatron-core=={wanted}.* (pyproject pins it) or use trainer.backend=torch"
        )


def needs_cpu_compat() -> bool:
    return not torch.cuda.is_available()


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # a bare index means a CUDA ordinal
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


def _cuda_type_name(name: str) -> str:
    return name.replace("torch.", "torch.cuda.", 1) if ".cuda." not in name else name


class _CpuDevices(TorchFunctionMode):
    """Rewrites CUDA device requests to CPU while megatron-core runs (see module docstring)."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return _cuda_type_name(func(*args))
        if func is torch.Tensor.to or func is torch.Tensor.pin_memory:
            if func is torch.Tensor.pin_memory:
                return args[0]
            args = tuple("cpu" if _is_cuda(a) else a for a in args)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return func(*args, **kwargs)


class _NoStream:
    """A CUDA stream or event stand-in: every method is a no-op returning another stand-in
    (record_event() gives an event whose synchronize() does nothing)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., _NoStream]:
        return lambda *args, **kwargs: _NoStream()

    def __enter__(self) -> _NoStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _stream_context(*args: Any, **kwargs: Any) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


_CUDA_STAND_INS: dict[str, Any] = {
    # a CPU device rather than an index: `device=torch.cuda.current_device()` then needs no
    # rewriting, which matters inside nested autograd.backward calls (activation
    # recomputation), where torch runs the engine with function modes popped; the one object
    # host_reads knows, so that a move to the current device is not counted as a host read
    "current_device": lambda: CURRENT_DEVICE_ON_CPU,
    "device_count": lambda: 1,
    "synchronize": lambda *args, **kwargs: None,
    "empty_cache": lambda: None,
    "current_stream": lambda *args, **kwargs: _NoStream(),
    "default_stream": lambda *args, **kwargs: _NoStream(),
    "stream": _stream_context,
    "Stream": _NoStream,
    "Event": _NoStream,
    "get_rng_state": lambda *args, **kwargs: torch.get_rng_state(),
    "set_rng_state": lambda state, *args, **kwargs: torch.set_rng_state(state),
    "manual_seed": lambda seed: torch.manual_seed(seed),
}


def _host_copy(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.detach().cpu().numpy()
    return tensor


def _get_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _set_rng_state(new_state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    torch.set_rng_state(new_state)


_RANDOM = "megatron.core.tensor_parallel.random"
_MODULE_STAND_INS: dict[tuple[str, str], Any] = {
    ("megatron.core.transformer.moe.token_dispatcher", "maybe_move_tensor_to_cpu"): _host_copy,
    (_RANDOM, "_get_cuda_rng_state"): _get_rng_state,
    (_RANDOM, "_set_cuda_rng_state"): _set_rng_state,
}


@contextlib.contextmanager
def _module_stand_ins() -> Iterator[None]:
    saved = []
    for (module_name, attr), stand_in in _MODULE_STAND_INS.items():
        module = importlib.import_module(module_name)
        saved.append((module, attr, getattr(module, attr)))
        setattr(module, attr, stand_in)
    try:
        yield
    finally:
        for module, attr, original in saved:
            setattr(module, attr, original)


class CpuRNGStatesTracker:
    """Named RNG states over torch's CPU generator, megatron's tracker interface."""

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def is_initialized(self) -> bool:
        return bool(self.states_)

    def reset(self) -> None:
        self.states_, self.seeds_ = {}, set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists")
        if name in self.states_:
            raise ValueError(f"rng state {name} already exists")
        self.seeds_.add(seed)
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        if name not in self.states_:
            raise KeyError(f"rng state {name} is not added")
        saved = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)


def _memory_buffer_class() -> type:
    from megatron.core.utils import GlobalMemoryBuffer

    class CpuMemoryBuffer(GlobalMemoryBuffer):  # type: ignore[misc]
        """parallel_state's scratch buffer, on CPU."""

        def get_tensor(
            self, tensor_shape: Any, dtype: torch.dtype, name: str, mem_alloc_context: Any = None
        ) -> torch.Tensor:
            numel = 1
            for size in tensor_shape:
                numel *= int(size)
            key = (name, dtype)
            if key not in self.buffer or self.buffer[key].numel() < numel:
                self.buffer[key] = torch.empty(numel, dtype=dtype, device="cpu")
            view: torch.Tensor = self.buffer[key][:numel].view(*tensor_shape)
            return view

    return CpuMemoryBuffer


def install_te_fallbacks() -> None:
    """megatron-core's torch paths where TransformerEngine is absent (see module docstring)."""
    check_megatron_version()
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if importlib.util.find_spec("transformer_engine") is None:
        multi_latent_attention.HAVE_TE = False
    _keep_adam_steps_on_reshard()
    _packed_mla_rope(multi_latent_attention)


def _packed_mla_rope(module: Any) -> None:
    """MLA's unfused RoPE reads cu_seqlens on the host per layer; rlpost's micro-batches carry
    their positions, and kernels.packed_mla_rope uses them (other calls go to megatron-core's)."""
    from rlpost.backends.megatron.kernels import packed_mla_rope

    module.apply_rotary_pos_emb = packed_mla_rope


def _keep_adam_steps_on_reshard() -> None:
    """Without Apex or TE, torch's Adam keeps `step` in every parameter's state; loading a
    fully_reshardable checkpoint copies each saved state into the live one by the live keys
    and skips `step` on the saved side (load_state_dict already restored it), so the copy
    fails on `step`. The live step stays as it is."""
    from megatron.core.optimizer import distrib_optimizer as dopt

    if getattr(dopt, "HAVE_APEX_OR_TE", True):
        return
    cls = dopt.DistributedOptimizer
    original = cls._set_main_param_and_optimizer_states
    if getattr(original, "_keeps_steps", False):
        return

    def set_states(self: Any, model_param: Any, tensors: dict[str, Any]) -> None:
        if "step" not in tensors and not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            group_index, group_order = self.model_param_group_index_map[model_param]
            main_param = self.optimizer.param_groups[group_index]["params"][group_order]
            step = self.optimizer.state[main_param].get("step")
            if step is not None:
                tensors = {**tensors, "step": step}
        original(self, model_param, tensors)

    set_states._keeps_steps = True  # type: ignore[attr-defined]
    cls._set_main_param_and_optimizer_states = set_states


def install_cpu_state() -> None:
    """CPU stand-ins for megatron's RNG tracker and scratch buffer (after parallel init)."""
    if not needs_cpu_compat():
        return
    check_megatron_version()
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mp_random

    install_te_fallbacks()
    mp_random._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    parallel_state._GLOBAL_MEMORY_BUFFER = _memory_buffer_class()()


def model_parallel_cpu_manual_seed(seed: int) -> None:
    """Megatron's seeding (data-parallel, tensor-parallel and expert states), on CPU."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import random as mp_random

    torch.manual_seed(seed)
    if not needs_cpu_compat():
        mp_random.model_parallel_cuda_manual_seed(seed)
        return
    install_cpu_state()
    tracker = mp_random._CUDA_RNG_STATE_TRACKER
    tracker.reset()
    offset = seed + 2718
    tracker.add(
        mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME, offset + ps.get_tensor_model_parallel_rank()
    )
    tracker.add(mp_random._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    expert_seed = (
        seed
        + 1024
        + 100 * ps.get_expert_model_parallel_rank()
        + ps.get_expert_tensor_parallel_rank()
    )
    tracker.add(mp_random._EXPERT_PARALLEL_RNG_TRACKER_NAME, expert_seed)


@contextlib.contextmanager
def cpu_compat() -> Iterator[None]:
    """Run megatron-core on CPU inside this block; a no-op where CUDA is available."""
    if not needs_cpu_compat():
        yield
        return
    check_megatron_version()
    saved = {name: getattr(torch.cuda, name) for name in _CUDA_STAND_INS}
    for name, stand_in in _CUDA_STAND_INS.items():
        setattr(torch.cuda, name, stand_in)
    try:
        with _CpuDevices(), _module_stand_ins(), torch._dynamo.config.patch(disable=True):
            yield
    finally:
        for name, original in saved.items():
            setattr(torch.cuda, name, original)


@contextlib.contextmanager
def in_process_checkpoint_writes() -> Iterator[None]:
    """Synchronous torch_dist saves without spawning a Manager process (see module docstring)."""
    check_megatron_version()
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    saved = filesystem_async._results_queue, filesystem_async._process_memory
    filesystem_async._results_queue = queue.Queue()
    if not filesystem_async.HAVE_PSUTIL:
        filesystem_async._process_memory = lambda: 0
    try:
        yield
    finally:
        filesystem_async._results_queue, filesystem_async._process_memory = saved


def untie_adam_steps(optimizer: Any) -> None:
    """Give every Adam state its own `step` tensor (see module docstring)."""
    check_megatron_version()
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(sub, "optimizer", None)
        for state in getattr(inner, "state", {}).values():
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].clone()
