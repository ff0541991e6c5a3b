"""MegatronTrainer against TorchTrainer on the same checkpoint and rollout: the same shared
losses and advantages (rlpost.algo) give the same metrics and the same weights after training.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlpost.backends.fp8 import Fp8Format
from rlpost.backends.fp8_convert import convert_folder
from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.backends.torch_trainer import TorchTrainer
from rlpost.types import TrainSample

from .conftest import run_world


def _on_torch(
    rank: int, world: int, port: int, model_dir: Any, configs: Any, kwargs: Any, work: Any
) -> Any:
    trainer = TorchTrainer(model_dir, *configs, **kwargs)
    try:
        return work(trainer)
    finally:
        trainer.close()


def on_torch(
    model_dir: Any, configs: Any, work: Callable[[TorchTrainer], Any], **kwargs: Any
) -> Any:
    """work(trainer) with the torch trainer in a forked child, like the megatron ranks: its
    process group (FSDP2 over one rank) never lives in the pytest process, whose later forks
    would inherit it, or hang on the threads it leaves."""
    [result] = run_world(_on_torch, 1, model_dir, configs, kwargs, work)
    return result


TOLERANCE = 1e-5
METRICS = ("train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/grad_norm")

ALGOS: dict[str, tuple[int, dict[str, Any]]] = {
    "token-mean": (8, {}),
    "kl-entropy-tis-two-steps": (
        4,
        {
            "loss_reduction": "sample_mean",
            "use_kl_loss": True,
            "kl_loss_coef": 0.1,
            "kl_loss_type": "low_var_kl",
            "entropy_coef": 0.01,
            "off_policy_correction": "tis",
            "eps_clip_high": 0.28,
        },
    ),
    "gspo": (
        8,
        {
            "advantage_estimator": "gspo",
            "eps_clip": 3e-3,
            "eps_clip_high": 4e-3,
            "loss_reduction": "sample_mean",
        },
    ),
}


def megatron_run(trainer: MegatronTrainer, samples: list[TrainSample]) -> dict[str, Any]:
    stats = trainer.compute_token_stats(samples)
    metrics = trainer.train_step(samples)
    weights = dict(kv for b in trainer.iter_hf_weights() for kv in b)
    return {"stats": stats, "metrics": metrics, "weights": weights}


@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.parametrize("sizes", [{}, {"pp": 2}], ids=["one-rank", "pp2"])
def test_matches_torch_backend(
    algo: str,
    sizes: dict[str, int],
    make_setup: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
) -> None:
    gbs, algo_fields = ALGOS[algo]
    setup, samples = make_setup("qwen3", gbs, algo=algo_fields, **sizes), make_rollout(8, seed=5)
    ours = setup.run(megatron_run, samples)

    stats, metrics, state = on_torch(
        setup.model.hf_checkpoint,
        setup.configs,
        lambda t: (
            t.compute_token_stats(samples),
            t.train_step(samples),
            dict(kv for bucket in t.iter_hf_weights() for kv in bucket),  # whole tensors
        ),
    )
    for a, b in zip(ours["stats"].logprobs, stats.logprobs, strict=True):
        assert float((a - b).abs().max()) <= TOLERANCE
    for a, b in zip(ours["stats"].entropy, stats.entropy, strict=True):
        assert float((a - b).abs().max()) <= TOLERANCE
    assert ours["metrics"]["train/optimizer_steps"] == metrics["train/optimizer_steps"]
    for key in (k for k in METRICS if k in metrics):  # train/kl: where a KL is measured
        assert key in ours["metrics"], key
        assert abs(ours["metrics"][key] - metrics[key]) <= TOLERANCE, key
    for name, weight in ours["weights"].items():
        assert float((weight - state[name]).abs().max()) <= TOLERANCE, name


def test_metric_names_match_torch_backend(
    make_setup: Callable[..., Any], make_rollout: Callable[..., list[TrainSample]]
) -> None:
    algo = {"off_policy_correction": "tis"}
    setup, samples = make_setup("qwen3", 8, algo=algo), make_rollout(8, seed=6)
    ours = setup.run(megatron_run, samples)
    theirs = on_torch(setup.model.hf_checkpoint, setup.configs, lambda t: t.train_step(samples))
    assert ours["metrics"].keys() == theirs.keys()


def test_rejects_rollout_that_does_not_split_into_steps(
    make_setup: Callable[..., Any], make_rollout: Callable[..., list[TrainSample]]
) -> None:
    with pytest.raises(Exception, match="global_batch_size=8"):
        make_setup("qwen3", 8).run(megatron_run, make_rollout(6))


def _two_rollouts(trainer: MegatronTrainer, rollouts: list[list[TrainSample]]) -> dict[str, Any]:
    metrics = [trainer.train_step(samples) for samples in rollouts]
    weights = dict(kv for b in trainer.iter_hf_weights() for kv in b)
    return {"metrics": metrics, "weights": weights, "reference": trainer.ref_model is not None}


def test_a_reference_that_weighs_nothing_is_skipped_and_the_updates_do_not_change(
    make_setup: Callable[..., Any], make_rollout: Callable[..., list[TrainSample]]
) -> None:
    """use_kl_loss with kl_loss_coef 0: measuring the KL every rollout (as before) and not
    loading the reference at all train to the same weights."""
    weightless = {"use_kl_loss": True, "kl_loss_coef": 0.0, "off_policy_correction": "tis"}
    rollouts = [make_rollout(8, seed=seed) for seed in (5, 6)]
    runs = {
        interval: make_setup("qwen3", 4, algo=weightless | {"kl_metric_interval": interval}).run(
            _two_rollouts, rollouts
        )
        for interval in (1, 0)
    }
    measured, skipped = runs[1], runs[0]
    assert measured["reference"] and not skipped["reference"]
    for a, b in zip(measured["metrics"], skipped["metrics"], strict=True):
        assert "train/kl" in a and "train/kl" not in b
        for key in ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-6, key
    for name, weight in measured["weights"].items():
        assert float((weight - skipped["weights"][name]).abs().max()) <= 1e-6, name


def _ref_stats(trainer: MegatronTrainer, samples: list[TrainSample]) -> list[Any]:
    return trainer.compute_token_stats(samples, "ref", with_entropy=False).logprobs


def _policy_stats(trainer: MegatronTrainer, samples: list[TrainSample]) -> list[Any]:
    return trainer.compute_token_stats(samples, with_entropy=False).logprobs


def test_an_hf_reference_folder_is_the_reference_in_both_trainers(
    make_setup: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
    tmp_path: Path,
) -> None:
    """model.ref_load naming an HF folder with other weights than hf_checkpoint: both
    trainers' reference forwards use that folder's weights (not hf_checkpoint's); and
    model.load naming it starts megatron's policy there, as it does the torch trainer's."""
    algo = {"use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": "low_var_kl"}
    setup = make_setup("qwen3", 8, algo=algo)
    other = tmp_path / "sft"
    shutil.copytree(setup.model.hf_checkpoint, other)
    weights = load_file(other / "model.safetensors")
    torch.manual_seed(3)
    save_file(
        {k: v + 0.05 * torch.randn_like(v) for k, v in weights.items()}, other / "model.safetensors"
    )
    samples = make_rollout(8, seed=7)
    ours = setup.with_model(ref_load=str(other)).run(_ref_stats, samples)
    torch_ref = on_torch(
        setup.model.hf_checkpoint,
        setup.configs,
        lambda t: t.compute_token_stats(samples, "ref", with_entropy=False),
        reference_dir=other,
    )
    as_policy = on_torch(
        other, setup.configs, lambda t: t.compute_token_stats(samples, with_entropy=False)
    )
    policy = setup.with_model(load=str(other)).run(_policy_stats, samples)
    for a, b, c, d in zip(ours, torch_ref.logprobs, as_policy.logprobs, policy, strict=True):
        assert float((a - c).abs().max()) <= TOLERANCE
        assert float((b - c).abs().max()) <= TOLERANCE
        assert float((d - c).abs().max()) <= TOLERANCE
    own = on_torch(
        setup.model.hf_checkpoint,
        setup.configs,
        lambda t: t.compute_token_stats(samples, with_entropy=False),
    )
    assert any(float((a - b).abs().max()) > 1e-3 for a, b in zip(ours, own.logprobs, strict=True))


def test_an_fp8_checkpoint_is_dequantised_by_both_trainers_never_cast(
    make_setup: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
    tmp_path: Path,
) -> None:
    """model.hf_checkpoint naming an FP8 folder (tools/convert_hf_to_fp8.py): megatron's
    conversion reads each weight times its block scales, as the torch trainer does, and the
    policy is the FP8 weights, not the FP8 bytes cast to bf16/fp32 with the scales ignored."""
    setup = make_setup("qwen3", 8)
    fp8 = convert_folder(setup.model.hf_checkpoint, tmp_path / "fp8", Fp8Format((16, 16)))
    samples = make_rollout(8, seed=9)
    megatron = setup.with_model(hf_checkpoint=str(fp8)).run(_policy_stats, samples)
    torch_fp8 = on_torch(
        fp8, setup.configs, lambda t: t.compute_token_stats(samples, with_entropy=False)
    )
    original = on_torch(
        setup.model.hf_checkpoint,
        setup.configs,
        lambda t: t.compute_token_stats(samples, with_entropy=False),
    )
    for a, b in zip(megatron, torch_fp8.logprobs, strict=True):
        assert float((a - b).abs().max()) <= TOLERANCE
    gaps = [float((a - b).abs().max()) for a, b in zip(megatron, original.logprobs, strict=True)]
    assert 0 < max(gaps) < 0.5, gaps  # FP8's rounding, not a different network
