"""The sharded torch trainer on one CUDA GPU: bf16 compute from float32 shards, and the
offload around a colocated rollout."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor

from rlpost.backends.sglang import trainer_side
from rlpost.backends.torch_trainer import TorchTrainer
from rlpost.backends.torch_trainer.model_io import router_modules
from rlpost.runtime.determinism import deterministic_env
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

Samples = Callable[..., list[TrainSample]]
Configs = Callable[..., tuple[AlgoConfig, OptimConfig, TrainConfig]]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def test_offload_moves_model_and_optimizer_state_off_the_gpu(
    tiny_model_dir: Path, make_samples: Samples, make_configs: Configs
) -> None:
    configs = make_configs(4)
    samples = make_samples(4, seed=5, with_rollout=True)
    # the CUDA trainer first: it makes the process group (gloo and NCCL), which the CPU
    # trainer then shares
    trainer = TorchTrainer(tiny_model_dir, *configs, device="cuda")
    first = trainer.train_step(samples)
    cpu = TorchTrainer(tiny_model_dir, *configs, num_threads=1).train_step(samples)
    # bf16 compute from float32 master shards: the CPU's float32 loss to bf16 tolerance
    assert first["train/loss"] == pytest.approx(cpu["train/loss"], abs=2e-2)
    params = list(trainer.model.parameters())
    assert all(_local(p).dtype == torch.float32 and _local(p).is_cuda for p in params)
    moved = trainer_side.offload(trainer)
    assert moved == sum(_local(p).numel() * 4 for p in params)
    assert all(_local(p).device.type == "cpu" for p in trainer.model.parameters())
    states = [v for s in trainer.optimizer.state.values() for v in s.values()]
    tensors = [_local(v) for v in states if isinstance(v, torch.Tensor) and v.dim()]
    assert tensors and all(v.device.type == "cpu" for v in tensors)
    trainer_side.onload(trainer)
    assert all(_local(p).is_cuda for p in trainer.model.parameters())
    assert trainer.train_step(samples)["train/loss"] == pytest.approx(first["train/loss"], abs=0.5)


def test_the_layers_compute_in_model_params_dtype(
    tiny_model_dir: Path, make_samples: Samples, make_configs: Configs
) -> None:
    """bf16 or fp32 (model.params_dtype) from the same float32 shards: fp32 matches the CPU's
    float32 step to float32 tolerance, bf16 to bf16's."""
    configs = make_configs(4)
    samples = make_samples(4, seed=5, with_rollout=True)
    inputs: dict[str, set[torch.dtype]] = {}
    losses: dict[str, float] = {}
    for dtype in ("bf16", "fp32"):
        trainer = TorchTrainer(tiny_model_dir, *configs, device="cuda", compute_dtype=dtype)
        linear = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Linear))
        seen = inputs.setdefault(dtype, set())
        hook = linear.register_forward_pre_hook(lambda _, args, s=seen: s.add(args[0].dtype))
        losses[dtype] = trainer.train_step(samples)["train/loss"]
        hook.remove()
        trainer.close()
    cpu = TorchTrainer(tiny_model_dir, *configs, num_threads=1).train_step(samples)
    assert inputs == {"bf16": {torch.bfloat16}, "fp32": {torch.float32}}
    assert losses["fp32"] == pytest.approx(cpu["train/loss"], rel=1e-4, abs=1e-5)
    assert losses["bf16"] == pytest.approx(cpu["train/loss"], abs=2e-2)


def test_moe_routers_compute_in_float32_beside_bf16_layers(
    tiny_moe_dir: Path, make_samples: Samples, make_configs: Configs
) -> None:
    """model.moe.router_dtype fp32 (the default) on CUDA: the router's logits in float32 from
    its float32 master weight, the experts in bf16; the step trains."""
    trainer = TorchTrainer(tiny_moe_dir, *make_configs(4), device="cuda", compute_dtype="bf16")
    routers = router_modules(trainer.model)
    seen: set[tuple[torch.dtype, torch.dtype]] = set()
    for router in routers:
        router.register_forward_hook(lambda _, args, out: seen.add((args[0].dtype, out[0].dtype)))
    metrics = trainer.train_step(make_samples(4, seed=5, with_rollout=True))
    assert len(routers) == 2 and seen == {(torch.float32, torch.float32)}
    assert metrics["train/grad_norm"] > 0.0
    trainer.close()


def test_deterministic_kernels_repeat_a_bf16_step_bit_for_bit(
    tiny_model_dir: Path,
    make_samples: Samples,
    make_configs: Configs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """run.deterministic on CUDA: the train rank's environment (cuBLAS's fixed workspace) and
    torch's deterministic kernels, as a run switches them on; two trainers from the same
    weights then take the same step, loss, gradient norm and weights alike."""
    for name, value in deterministic_env(True, on_gpu=True).items():
        monkeypatch.setenv(name, value)
    samples = make_samples(4, seed=5, with_rollout=True)
    torch.use_deterministic_algorithms(True)
    try:
        steps = []
        for _ in range(2):
            trainer = TorchTrainer(
                tiny_model_dir, *make_configs(4), device="cuda", compute_dtype="bf16"
            )
            metrics = trainer.train_step(samples)
            weights = [_local(p).detach().cpu().clone() for p in trainer.model.parameters()]
            steps.append((metrics["train/loss"], metrics["train/grad_norm"], weights))
            trainer.close()
    finally:
        torch.use_deterministic_algorithms(False)
    (loss_a, norm_a, weights_a), (loss_b, norm_b, weights_b) = steps
    assert (loss_a, norm_a) == (loss_b, norm_b)
    assert all(torch.equal(a, b) for a, b in zip(weights_a, weights_b, strict=True))
