"""Mixture-of-experts models in the torch trainer: their routers compute in
model.moe.router_dtype while the layers compute in model.params_dtype, and their experts run
as model.moe.grouped_gemm says.

On CUDA with bf16 layers a float32 router is an FSDP2 unit of its own, gathered in float32 from
the float32 master shards with its input cast up. On CPU everything is float32, so the tests
that look at dtypes run the CUDA policies on CPU (FSDP2's casts are the same on both devices);
`test_gpu.py` checks the real thing."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedModel,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.integrations.moe import ExpertsInterface

from rlpost.backends.torch_trainer import TorchTrainer, distributed
from rlpost.backends.torch_trainer.distributed import full_tensor, router_precision
from rlpost.backends.torch_trainer.model_io import (
    EXPERT_LOOP,
    GROUPED_EXPERTS,
    build_causal_lm,
    router_modules,
)
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

Samples = Callable[..., list[TrainSample]]
Configs = Callable[..., tuple[AlgoConfig, OptimConfig, TrainConfig]]

SMALL = {"vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 3}


def _meta(model_class: type[PreTrainedModel], config: Any) -> PreTrainedModel:
    with torch.device("meta"):
        return model_class(config)


@pytest.mark.parametrize(
    ("model_class", "config", "moe_layers"),
    [
        (Qwen3MoeForCausalLM, Qwen3MoeConfig(**SMALL, num_experts=8, num_experts_per_tok=2), 3),
        (
            Glm4MoeForCausalLM,
            Glm4MoeConfig(**SMALL, n_routed_experts=8, first_k_dense_replace=1, n_group=1),
            2,
        ),
        (
            DeepseekV3ForCausalLM,
            DeepseekV3Config(**SMALL, n_routed_experts=8, first_k_dense_replace=2, n_group=1),
            1,
        ),
        (MixtralForCausalLM, MixtralConfig(**SMALL, num_local_experts=8), 3),
        (Qwen3ForCausalLM, Qwen3Config(**SMALL), 0),
    ],
)
def test_routers_are_the_expert_by_hidden_weights_of_each_moe_layer(
    model_class: type[PreTrainedModel], config: Any, moe_layers: int
) -> None:
    model = _meta(model_class, config)
    routers = router_modules(model)
    assert len(routers) == moe_layers
    names = {module: name for name, module in model.named_modules()}
    assert all(names[r].endswith("mlp.gate") for r in routers), [names[r] for r in routers]


def test_a_router_has_its_own_precision_only_where_it_differs_from_the_layers() -> None:
    assert router_precision("cpu", "fp32", "fp32") is None
    assert router_precision("cpu", "bf16", "fp32") is None  # CPU: float32 throughout
    assert router_precision("cuda", "bf16", "bf16") is None
    assert router_precision("cuda", "fp32", "fp32") is None
    float32 = MixedPrecisionPolicy(torch.float32, torch.float32)
    assert router_precision("cuda", "bf16", "fp32") == float32
    assert float32.cast_forward_inputs  # the bf16 hidden states reach the router as float32
    assert router_precision("cuda", "fp32", "bf16") == MixedPrecisionPolicy(
        torch.bfloat16, torch.float32
    )
    with pytest.raises(ValueError, match="not fp16"):
        router_precision("cuda", "bf16", "fp16")


def _as_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The precision policies FSDP2 gets on CUDA, on this CPU."""
    layers, routers = distributed.mixed_precision, distributed.router_precision
    monkeypatch.setattr(distributed, "mixed_precision", lambda _, dtype: layers("cuda", dtype))
    monkeypatch.setattr(
        distributed, "router_precision", lambda _, dtype, router: routers("cuda", dtype, router)
    )


def _watch(trainer: TorchTrainer) -> dict[str, list[torch.dtype]]:
    """The dtypes each router's input, logits and routing weights and the experts' input
    arrive in, forward by forward."""
    seen: dict[str, list[torch.dtype]] = {"input": [], "logits": [], "weights": [], "experts": []}

    def router(module: Any, args: Any, out: Any) -> None:
        seen["input"].append(args[0].dtype)
        seen["logits"].append(out[0].dtype)
        seen["weights"].append(out[1].dtype)

    def experts(module: Any, args: Any, out: Any) -> None:
        seen["experts"].append(args[0].dtype)

    for module in router_modules(trainer.model):
        module.register_forward_hook(router)
    for module in trainer.model.modules():
        if type(module).__name__.endswith("Experts"):
            module.register_forward_hook(experts)
    return seen


@pytest.mark.parametrize("router_dtype", ["fp32", "bf16"])
def test_routers_compute_in_router_dtype_beside_bf16_layers(
    tiny_moe_dir: Path,
    make_samples: Samples,
    make_configs: Configs,
    monkeypatch: pytest.MonkeyPatch,
    router_dtype: str,
) -> None:
    _as_on_cuda(monkeypatch)
    trainer = TorchTrainer(
        tiny_moe_dir,
        *make_configs(4),
        num_threads=1,
        compute_dtype="bf16",
        router_dtype=router_dtype,
    )
    routers = router_modules(trainer.model)
    assert len(routers) == 2
    before = [full_tensor(r.weight.detach()).clone() for r in routers]
    seen = _watch(trainer)
    metrics = trainer.train_step(make_samples(4, seed=1))
    routed = torch.float32 if router_dtype == "fp32" else torch.bfloat16
    assert seen["input"] and set(seen["input"]) == {routed}
    assert set(seen["logits"]) == set(seen["weights"]) == {routed}
    assert set(seen["experts"]) == {torch.bfloat16}  # the rest of the layer stays in bf16
    assert all(isinstance(r, FSDPModule) == (router_dtype == "fp32") for r in routers)
    assert math.isfinite(metrics["train/grad_norm"])
    after = [full_tensor(r.weight.detach()) for r in routers]
    assert all(r.weight.dtype == torch.float32 for r in routers)  # the master shards
    assert all(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_on_cpu_routers_stay_in_their_layers_and_train_alike(
    tiny_moe_dir: Path, make_samples: Samples, make_configs: Configs
) -> None:
    """Float32 everywhere: router_dtype changes nothing, and no unit is added."""
    samples = make_samples(4, seed=2)
    losses = []
    for router_dtype in ("fp32", "bf16"):
        trainer = TorchTrainer(
            tiny_moe_dir, *make_configs(4), num_threads=1, router_dtype=router_dtype
        )
        assert not any(isinstance(r, FSDPModule) for r in router_modules(trainer.model))
        losses.append(trainer.train_step(samples)["train/loss"])
        trainer.close()
    assert losses[0] == losses[1]


def test_experts_run_grouped_or_one_at_a_time_as_grouped_gemm_says(
    tiny_moe_dir: Path,
    make_samples: Samples,
    make_configs: Configs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """true: transformers' grouped experts (one grouped matrix multiply per projection over
    all experts); false: its loop over the experts. The same math either way."""
    grouped_calls = []
    grouped = ExpertsInterface._global_mapping[GROUPED_EXPERTS]

    def spy(*args: Any, **kwargs: Any) -> Any:
        grouped_calls.append(1)
        return grouped(*args, **kwargs)

    monkeypatch.setitem(ExpertsInterface._global_mapping, GROUPED_EXPERTS, spy)
    samples = make_samples(4, seed=3)
    losses, calls = {}, {}
    for grouped_gemm in (True, False):
        grouped_calls.clear()
        trainer = TorchTrainer(
            tiny_moe_dir, *make_configs(4), num_threads=1, grouped_gemm=grouped_gemm
        )
        assert trainer.model.config._experts_implementation == (
            GROUPED_EXPERTS if grouped_gemm else EXPERT_LOOP
        )
        losses[grouped_gemm] = trainer.train_step(samples)["train/loss"]
        calls[grouped_gemm] = len(grouped_calls)
        trainer.close()
    assert calls[True] > 0 and calls[False] == 0
    assert losses[True] == pytest.approx(losses[False], rel=1e-5, abs=1e-6)


def test_grouped_experts_on_a_class_without_them_name_the_key(
    tiny_moe_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        Qwen3MoeForCausalLM, "_can_set_experts_implementation", classmethod(lambda cls: False)
    )
    with pytest.raises(ValueError, match=r"model\.moe\.grouped_gemm: true.*grouped_gemm=false"):
        build_causal_lm(tiny_moe_dir, grouped_gemm=True)
    assert build_causal_lm(tiny_moe_dir, grouped_gemm=False).config._experts_implementation == (
        EXPERT_LOOP
    )


@pytest.mark.parametrize("model", ["qwen3_moe", "glm4_moe"])
def test_weights_leave_in_the_checkpoints_layout_one_tensor_per_expert(
    model: str, request: pytest.FixtureRequest, make_configs: Configs, tmp_path: Path
) -> None:
    """What the engines receive (iter_hf_weights) and the HF export are the checkpoint's
    names and tensors, as SGLang loads them, not transformers' stacked experts; a router's
    expert bias (a persistent buffer, GLM-4.5's and DeepSeek-V3's) travels with them."""
    from rlpost.backends.hf_load import read_weights

    folder = request.getfixturevalue("tiny_moe_dir" if model == "qwen3_moe" else "tiny_glm_moe_dir")
    stored = read_weights(folder, torch.float32)
    trainer = TorchTrainer(folder, *make_configs(4), num_threads=1)
    assert any(n.endswith("experts.gate_up_proj") for n, _ in trainer.model.named_parameters())
    sent = [pair for bucket in trainer.iter_hf_weights(bucket_bytes=64 << 10) for pair in bucket]
    names = [name for name, _ in sent]
    assert len(names) == len(set(names)) and set(names) == set(stored)
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in names
    assert all(torch.equal(tensor, stored[name]) for name, tensor in sent)
    exported = read_weights(trainer.export_hf(tmp_path / "hf"), torch.float32)
    assert set(exported) == set(stored)
    assert all(torch.equal(exported[n], stored[n]) for n in stored)
    trainer.close()
