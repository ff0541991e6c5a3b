"""MTP (multi-token prediction) layers trained beside the policy: they load from and export to
HF checkpoints exactly, their loss matches a plain HF computation and falls with training, it
never leaks across packed samples, it leaves the policy's update alone, and TP/PP/CP runs
equal one process. With MTP training off the checkpoint's MTP tensors pass through.

The checkpoints are the tiny GLM-4.5-style MoE and GLM-4.7-Flash-style MLA ones of
tiny_checkpoints.py plus one MTP layer (HF layer 2, after the two decoder layers).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from rlpost.backends.megatron.conversion import torch_dist_to_hf
from rlpost.backends.megatron.convert import has_mtp_layers
from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.backends.megatron.weights import Placement, WeightMap
from rlpost.config.loader import compose_run_config
from rlpost.errors import UserError
from rlpost.schema import ModelConfig
from rlpost.types import TrainSample

REPO = Path(__file__).resolve().parents[4]
LAYERS = 2  # decoder layers of the tiny checkpoints; HF layer 2 is the MTP layer
TOLERANCE = 1e-5
MTP = "model.layers.2."  # the HF names of the MTP layer start so
MTP_HF = ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight")


def add_mtp_layer(src: Path, dst: Path, repeats: bool) -> None:
    """`src` plus HF layer 2 as an MTP layer: a perturbed copy of layer 1 (an MoE layer) with
    the MTP norms and projection; `repeats`: also the per-layer copies of the embedding and
    output head that GLM-4.5 and DeepSeek-V3 checkpoints carry."""
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    gen = torch.Generator().manual_seed(7)
    for name in [n for n in tensors if n.startswith("model.layers.1.")]:
        copy = tensors[name] + 0.05 * torch.randn(tensors[name].shape, generator=gen)
        tensors[name.replace("layers.1.", "layers.2.")] = copy
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    tensors[MTP + "eh_proj.weight"] = 0.08 * torch.randn(hidden, 2 * hidden, generator=gen)
    for norm in MTP_HF[1:]:
        tensors[MTP + norm] = 1.0 + 0.2 * torch.randn(hidden, generator=gen)
    if repeats:
        tensors[MTP + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
        tensors[MTP + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(config | {"num_nextn_predict_layers": 1}))


@pytest.fixture(scope="module")
def mtp_models(
    tiny_models: Callable[[str], ModelConfig], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], ModelConfig]:
    """Architecture -> its tiny checkpoint with an MTP layer: glm4_moe (GQA; the checkpoint
    repeats the embedding and head in the MTP layer) or glm4_moe_lite (MLA; it does not)."""
    root, built = tmp_path_factory.mktemp("mtp"), {}

    def get(arch: str) -> ModelConfig:
        if arch not in built:
            base = tiny_models(arch)
            add_mtp_layer(Path(base.hf_checkpoint), root / arch, repeats=arch == "glm4_moe")
            update = {"hf_checkpoint": str(root / arch), "mtp_num_layers": 1}
            built[arch] = base.model_copy(update=update)
        return built[arch]

    return get


@pytest.fixture
def mtp_setup(
    mtp_models: Callable[[str], ModelConfig], make_setup: Callable[..., Any]
) -> Callable[..., Any]:
    """mtp_setup(arch, on=True, train=, **make_setup's keywords): a Setup of the architecture's
    MTP checkpoint, training its MTP layer or not."""

    def make(arch: str, on: bool = True, *, train: dict | None = None, **fields: Any) -> Any:
        return make_setup(mtp_models(arch), train={"mtp_training": on} | (train or {}), **fields)

    return make


def initial_tensors(model: ModelConfig) -> dict[str, torch.Tensor]:
    """The tensors of a tiny checkpoint (one safetensors file)."""
    return load_file(str(Path(model.hf_checkpoint) / "model.safetensors"))


def train(
    trainer: MegatronTrainer,
    samples: list[TrainSample],
    steps: int = 1,
    export_to: Path | None = None,
) -> dict[str, Any]:
    """`steps` rollouts of training; metrics per rollout and the weights in HF names after."""
    metrics = [trainer.train_step(samples) for _ in range(steps)]
    weights = dict(kv for b in trainer.iter_hf_weights(bucket_bytes=16 << 10) for kv in b)
    if export_to is not None:
        trainer.export_hf(export_to)
    return {"metrics": metrics, "weights": weights}


# ---- names, conversion, export ---------------------------------------------------------------


def test_mtp_names_map_to_the_layer_after_the_decoder(
    mtp_models: Callable[[str], ModelConfig],
) -> None:
    weights = WeightMap(mtp_models("glm4_moe"))
    assert weights.rule("mtp.layers.0.eh_proj.weight").hf_names == (
        "model.layers.2.eh_proj.weight",
    )
    assert weights.rule("mtp.layers.0.final_layernorm.weight").hf_names == (
        "model.layers.2.shared_head.norm.weight",
    )
    expert = "mtp.layers.0.transformer_layer.mlp.experts.local_experts.1.linear_fc2.weight"
    assert Placement(layer_offset=1, expert_offset=2).global_name(expert) == expert.replace(
        "experts.1.", "experts.3."
    )
    rule = weights.rule(expert)
    assert rule.hf_names == ("model.layers.2.mlp.experts.1.down_proj.weight",) and rule.expert
    assert weights.mtp_shared_source("model.layers.2.shared_head.head.weight") == "lm_head.weight"
    assert weights.mtp_shared_source("model.layers.1.embed_tokens.weight") is None


def _tool(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def round_trip(rank: int, world: int, port: int, model: ModelConfig, root: Path) -> bool:
    """HF -> torch_dist -> HF with the two conversion tools; whether the torch_dist has MTP."""
    model_yaml = root / "model.yaml"
    model_yaml.write_text(yaml.safe_dump(model.model_dump(mode="json")))
    dist_dir, hf_dir = str(root / "torch_dist"), str(root / "hf")
    to_dist = ["--model-yaml", str(model_yaml), "--save", dist_dir]
    assert _tool("convert_hf_to_megatron").main(to_dist) == 0
    to_hf = ["--model-yaml", str(model_yaml), "--load", dist_dir, "--out", hf_dir]
    assert _tool("convert_megatron_to_hf").main(to_hf) == 0
    return has_mtp_layers(dist_dir)


@pytest.mark.parametrize("arch", ["glm4_moe", "glm4_moe_lite"])
def test_round_trip_through_torch_dist_is_exact(
    arch: str,
    mtp_models: Callable[[str], ModelConfig],
    world: Callable[..., list[Any]],
    same_hf: Callable[[str | Path, str | Path], None],
    tmp_path: Path,
) -> None:
    model = mtp_models(arch)
    assert world(round_trip, 1, model, tmp_path)[0]  # the MTP layer is in the torch_dist
    same_hf(model.hf_checkpoint, tmp_path / "hf")


@pytest.fixture
def train_and_export(
    mtp_setup: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
    hf_tensors: Callable[..., dict[str, torch.Tensor]],
    tmp_path: Path,
) -> Callable[..., tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """(arch, on) -> train's results after one rollout, the checkpoint's tensors, and those of
    the HF checkpoint exported after training (under the same names)."""

    def run(arch: str, on: bool) -> tuple[Any, Any, Any]:
        setup = mtp_setup(arch, on)
        result = setup.run(train, make_rollout(8), 1, tmp_path)
        before, after = hf_tensors(setup.model.hf_checkpoint), hf_tensors(tmp_path)
        assert before.keys() == after.keys()
        return result, before, after

    return run


def test_trained_mtp_layer_is_exported_with_its_repeats(
    train_and_export: Callable[..., tuple[Any, Any, Any]],
) -> None:
    _, before, after = train_and_export("glm4_moe", True)
    for name in MTP_HF:  # trained, not passed through
        assert not torch.equal(before[f"{MTP}{name}"], after[f"{MTP}{name}"])
    for repeat, shared in (("embed_tokens", "model.embed_tokens"), ("shared_head.head", "lm_head")):
        assert torch.equal(after[f"{MTP}{repeat}.weight"], after[f"{shared}.weight"])
        assert not torch.equal(after[f"{shared}.weight"], before[f"{shared}.weight"])


def test_without_mtp_training_the_mtp_layer_passes_through(
    train_and_export: Callable[..., tuple[Any, Any, Any]],
) -> None:
    result, before, after = train_and_export("glm4_moe_lite", False)
    assert "train/mtp_loss" not in result["metrics"][0]
    assert not any(name.startswith(MTP) for name in result["weights"])
    assert all(torch.equal(before[n], after[n]) for n in before if n.startswith(MTP))


# ---- the loss ----------------------------------------------------------------------------------


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def hf_mtp_loss(model: ModelConfig, samples: list[TrainSample]) -> float:
    """The MTP loss from transformers' modules: the main model (2 layers), then HF layer 2 of a
    3-layer build on [enorm(embedding of token i+1), hnorm(h_i)] -> token i+2, masked CE."""
    path = Path(model.hf_checkpoint)
    main = AutoModelForCausalLM.from_pretrained(path).eval()
    config = AutoConfig.from_pretrained(path, num_hidden_layers=LAYERS + 1)
    if getattr(config, "mlp_layer_types", None):
        config.mlp_layer_types = [*config.mlp_layer_types[:LAYERS], "sparse"]
    layer = AutoModelForCausalLM.from_pretrained(path, config=config).model.layers[LAYERS].eval()
    extra = {n.removeprefix(MTP): t for n, t in initial_tensors(model).items() if n.startswith(MTP)}
    eps = model.norm_epsilon
    total, count = 0.0, 0.0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.tokens])
            hidden = main.model(ids).last_hidden_state[:, :-1]
            embedded = main.model.embed_tokens(ids[:, 1:])
            normed = [
                _rms(embedded, extra["enorm.weight"], eps),
                _rms(hidden, extra["hnorm.weight"], eps),
            ]
            x = torch.cat(normed, dim=-1) @ extra["eh_proj.weight"].T
            positions = torch.arange(x.shape[1]).unsqueeze(0)
            rope = main.model.rotary_emb(x, positions)
            y = layer(x, position_ids=positions, position_embeddings=rope)
            y = y[0] if isinstance(y, tuple) else y
            logits = main.lm_head(_rms(y, extra["shared_head.norm.weight"], eps))
            ce = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 2:], reduction="none")
            mask = torch.zeros(s.length)
            mask[s.length - s.response_length :] = torch.tensor(s.loss_mask, dtype=torch.float)
            total += float((ce * mask[2:]).sum())
            count += float(mask[2:].sum())
    return total / count


@pytest.mark.parametrize("arch", ["glm4_moe", "glm4_moe_lite"])
def test_mtp_loss_matches_transformers(
    arch: str, mtp_setup: Callable[..., Any], make_rollout: Callable[..., list[TrainSample]]
) -> None:
    setup, samples = mtp_setup(arch), make_rollout(8, seed=3, min_len=3)
    result = setup.run(train, samples)
    assert result["metrics"][0]["train/mtp_loss"] == pytest.approx(
        hf_mtp_loss(setup.model, samples), abs=TOLERANCE
    )


def test_mtp_loss_falls_when_training_on_one_batch(
    mtp_setup: Callable[..., Any], make_rollout: Callable[..., list[TrainSample]]
) -> None:
    result = mtp_setup("glm4_moe_lite").run(train, make_rollout(8, seed=4), 4)
    losses = [m["train/mtp_loss"] for m in result["metrics"]]
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < losses[0] - 0.1


def test_mtp_loss_does_not_leak_across_packed_samples(mtp_setup: Callable[..., Any]) -> None:
    """One-token prompts make every token after the first one a loss token, so a depth that
    read or predicted across a sample boundary would change the loss: all eight samples in one
    micro-batch train exactly as eight micro-batches of one."""
    samples = [
        TrainSample([2 + (5 * i + 3 * j) % 90 for j in range(n)], n - 1, float(i % 2 * 2 - 1))
        for i, n in enumerate([9, 7, 12, 7, 10, 8, 8, 11])
    ]
    runs = [
        mtp_setup("glm4_moe", train={"max_tokens_per_gpu": cap}).run(train, samples)
        for cap in (12, 96)
    ]
    assert [r["metrics"][0]["train/micro_batches"] for r in runs] == [8, 1]
    assert runs[0]["metrics"][0]["train/mtp_loss"] == pytest.approx(
        runs[1]["metrics"][0]["train/mtp_loss"], abs=TOLERANCE
    )
    for name, weight in runs[0]["weights"].items():
        assert float((runs[1]["weights"][name] - weight).abs().max()) <= TOLERANCE, name


def test_mtp_training_leaves_the_policy_update_alone(
    mtp_setup: Callable[..., Any], make_rollout: Callable[..., list[TrainSample]]
) -> None:
    """Without clipping (whose global norm counts the MTP layer's gradients too) the main
    model's weights after a step are the same with MTP training on and off."""
    samples = make_rollout(8, seed=8)
    on, off = (
        mtp_setup("glm4_moe", mtp, optim={"clip_grad": 0.0}).run(train, samples)
        for mtp in (True, False)
    )
    assert on["metrics"][0]["train/loss"] == off["metrics"][0]["train/loss"]
    assert off["weights"].keys() < on["weights"].keys()
    for name, weight in off["weights"].items():
        assert torch.equal(on["weights"][name], weight), name
    initial = initial_tensors(mtp_setup("glm4_moe").model)[MTP + "eh_proj.weight"]
    assert not torch.equal(on["weights"][MTP + "eh_proj.weight"], initial)


def test_torch_dist_without_mtp_layers_takes_them_from_hf(
    tiny_models: Callable[[str], ModelConfig],
    mtp_setup: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
    world: Callable[..., list[Any]],
    same_hf: Callable[[str | Path, str | Path], None],
    tmp_path: Path,
) -> None:
    """A torch_dist of the same weights without the MTP layer (converted from the checkpoint
    before it had one): training loads the layer from model.hf_checkpoint, and conversion back
    to HF passes it through."""
    world(round_trip, 1, tiny_models("glm4_moe"), tmp_path)
    setup, samples = mtp_setup("glm4_moe"), make_rollout(8, seed=6)
    from_dist = setup.with_model(load=str(tmp_path / "torch_dist"))
    runs = [s.run(train, samples) for s in (setup, from_dist)]
    assert runs[0]["metrics"][0]["train/mtp_loss"] == runs[1]["metrics"][0]["train/mtp_loss"]
    model = setup.model
    world(lambda r, w, p: torch_dist_to_hf(model, tmp_path / "torch_dist", tmp_path / "back"), 1)
    same_hf(model.hf_checkpoint, tmp_path / "back")


def test_resumed_run_takes_the_same_step(
    mtp_setup: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
    kept_and_resumed: Callable[..., tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """Under PP 2 the last stage holds the MTP layer and its own copy of the embedding."""
    setup = mtp_setup("glm4_moe", pp=2)
    kept, resumed = kept_and_resumed(setup, make_rollout(8, seed=9))
    assert resumed["metrics"]["train/mtp_loss"] == kept["metrics"]["train/mtp_loss"]
    for name, weight in kept["weights"].items():
        assert torch.equal(resumed["weights"][name], weight), name


# ---- parallel layouts --------------------------------------------------------------------------

CASES = {
    "moe-tp2-etp2-sp": ("glm4_moe", {"tp": 2, "etp": 2, "sequence_parallel": True}),
    "moe-pp2": ("glm4_moe", {"pp": 2}),
    "moe-pp2-recompute": ("glm4_moe", {"pp": 2, "recompute": "full"}),
    "moe-cp2": ("glm4_moe", {"cp": 2}),
    "moe-ep2-dp2": ("glm4_moe", {"ep": 2, "dp": 2}),
    "mla-tp2-ep2-sp": ("glm4_moe_lite", {"tp": 2, "ep": 2, "sequence_parallel": True}),
    "mla-pp2": ("glm4_moe_lite", {"pp": 2}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_match_one(
    case: str,
    mtp_setup: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
    reference_and_run: Callable[..., tuple[Any, Any]],
) -> None:
    arch, sizes = CASES[case]
    setup = mtp_setup(arch, **sizes)
    reference, result = reference_and_run(setup, train, make_rollout(8, seed=11))
    for key in ("train/loss", "train/mtp_loss", "train/grad_norm"):
        assert result["metrics"][0][key] == pytest.approx(
            reference["metrics"][0][key], abs=TOLERANCE
        ), key
    assert result["weights"].keys() == reference["weights"].keys()
    for name, weight in reference["weights"].items():
        assert float((result["weights"][name] - weight).abs().max()) <= TOLERANCE, name
    initial = initial_tensors(setup.model)[MTP + "eh_proj.weight"]
    assert float((reference["weights"][MTP + "eh_proj.weight"] - initial).abs().max()) > 1e-4


# ---- configuration -----------------------------------------------------------------------------


def test_mtp_training_needs_mtp_layers() -> None:
    overrides = ["model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8"]
    with pytest.raises(UserError, match="mtp_num_layers=0") as error:
        compose_run_config([*overrides, "recipe.train.mtp_training=true"])
    assert "recipe.train.mtp_training" in str(error.value)
    run, _ = compose_run_config(
        ["model=glm4.7-flash", *overrides[1:], "recipe.train.mtp_training=true"]
    )
    assert run.recipe.train.mtp_training and run.model.mtp_num_layers == 1
