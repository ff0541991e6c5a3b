"""torch.compile for the trainers' elementwise arithmetic, on CUDA, with the eager function as
the path everywhere else.

A decoder layer's matmuls and attention are single kernels; what lies between them (RoPE,
SwiGLU, the log-prob kernel's float32 softmax statistics and gradients) is, run eagerly, one
kernel per operation, each reading and writing whole activations. TorchInductor turns each such
function into one or two Triton kernels. TransformerEngine and Liger are optional; Triton comes
with every CUDA build of torch, so this is the path that is always there on a GPU.

`Compiled(fn)` calls `torch.compile(fn)` for inputs on a device of COMPILE_DEVICES and `fn`
itself for the rest (the CPU tests run `fn`; they check the compiled graph with the
`aot_eager` backend, which traces exactly what Inductor would compile). The functions are called
with autograd off (inside the forward and backward of an autograd.Function), so everything that
is compiled is compiled on the first call, where a failure is caught: the function then stays
eager for the rest of the process, with one warning. RLPOST_COMPILE=0 keeps every function eager.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, ParamSpec, TypeVar

import torch
from torch import Tensor

from rlpost import switches

log = logging.getLogger(__name__)


P = ParamSpec("P")
R = TypeVar("R")


@functools.cache
def compile_devices() -> frozenset[str]:
    """The device types whose inputs go through torch.compile: CUDA, when this torch build has
    Triton for it and RLPOST_COMPILE is not 0."""
    if switches.COMPILE.value() == "0" or not torch.cuda.is_available():
        return frozenset()
    try:
        from torch.utils._triton import has_triton
    except ImportError:
        return frozenset()
    return frozenset({"cuda"}) if has_triton() else frozenset()


_eager = False


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Every Compiled function runs its eager function inside this block (the benchmarks'
    comparison)."""
    global _eager
    before, _eager = _eager, True
    try:
        yield
    finally:
        _eager = before


def _device_type(args: Iterable[object]) -> str | None:
    for arg in args:
        if isinstance(arg, Tensor):
            return arg.device.type
    return None


class Compiled(Generic[P, R]):
    """`fn` compiled for inputs on `devices` (default: compile_devices()), eager otherwise.

    `backend`: torch.compile's backend ("inductor"; the tests use "aot_eager"). Every tensor
    argument's first dimension is dynamic from the first call (token counts change with every
    micro-batch, and a recompile per count would cost more than the kernels save); the other
    dimensions (heads, head size, FFN width, a vocabulary chunk) stay static, which lets Inductor
    index and vectorise as for fixed shapes (with every dimension symbolic, a SwiGLU backward
    ran at a fifth of the memory bandwidth)."""

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        devices: Iterable[str] | None = None,
        backend: str = "inductor",
    ) -> None:
        self.fn = fn
        self.devices = None if devices is None else frozenset(devices)
        self.backend = backend
        self._compiled: Callable[P, R] | None = None
        self.failed: BaseException | None = None
        functools.update_wrapper(self, fn)

    def applies(self, *args: object) -> bool:
        devices = compile_devices() if self.devices is None else self.devices
        return not _eager and self.failed is None and _device_type(args) in devices

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if not self.applies(*args):
            return self.fn(*args, **kwargs)
        if self._compiled is None:
            self._compiled = torch.compile(
                self.fn, backend=self.backend, dynamic=None, fullgraph=True
            )
        assert self._compiled is not None
        for arg in args:
            if isinstance(arg, Tensor) and arg.dim() > 0:
                torch._dynamo.maybe_mark_dynamic(arg, 0)
        try:
            return self._compiled(*args, **kwargs)
        except Exception as error:  # a compiler that fails here must not stop training
            # the first failure is the last: applies() sends every later call to `fn`
            log.warning(
                "torch.compile failed for %s, which runs eagerly from now on (%s: %s); "
                "RLPOST_COMPILE=0 skips compiling", self.fn.__qualname__,
                type(error).__name__, str(error).splitlines()[0] if str(error) else "",
            )  # fmt: skip
            self.failed = error
            return self.fn(*args, **kwargs)


def compiled(fn: Callable[P, R]) -> Compiled[P, R]:
    """Decorator: `Compiled(fn)` with the defaults."""
    return Compiled(fn)


def compiled_functions(module: Any) -> list[Compiled[Any, Any]]:
    """The Compiled functions a module defines (for the benchmarks' report)."""
    return [v for v in vars(module).values() if isinstance(v, Compiled)]
