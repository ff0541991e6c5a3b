import copy
import resource
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlpost.backends.torch_trainer import TorchTrainer, distributed
from rlpost.backends.torch_trainer.distributed import full_tensor
from rlpost.backends.torch_trainer.forward import forward_tokens, pack_samples
from rlpost.backends.torch_trainer.model_io import decoder_layers
from rlpost.plan.layout import ParallelLayout
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

Samples = Callable[..., list[TrainSample]]
Configs = Callable[..., tuple[AlgoConfig, OptimConfig, TrainConfig]]

FULL_ALGO = {
    "use_kl_loss": True,
    "kl_loss_coef": 0.3,
    "kl_loss_type": "low_var_kl",
    "entropy_coef": 0.01,
    "eps_clip_high": 0.28,
    "eps_clip_c": 3.0,
    "off_policy_correction": "tis",
}


def trainer(
    model_dir: Path, algo: AlgoConfig, optim: OptimConfig, train: TrainConfig
) -> TorchTrainer:
    return TorchTrainer(model_dir, algo, optim, train, rollout_temperature=0.8, num_threads=1)


def grads(t: TorchTrainer) -> list[torch.Tensor]:
    """Whole gradients, gathered from the trainer's shards."""
    return [full_tensor(p.grad).clone() for p in t.model.parameters()]


LAYOUTS = {
    "one_by_one": {"micro_batch_size": 1},
    "fixed_8": {"micro_batch_size": 8},
    "packed_all": {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 4096},
    "packed_capped": {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 40},
}


# gspo averages over responses: token_mean with it is refused (AlgoConfig)
@pytest.mark.parametrize(
    ("estimator", "reduction"),
    [("grpo", "sample_mean"), ("grpo", "token_mean"), ("gspo", "sample_mean")],
)
def test_loss_and_grads_do_not_depend_on_micro_batching(
    tiny_model_dir: Path,
    make_samples: Samples,
    make_configs: Configs,
    reduction: str,
    estimator: str,
) -> None:
    """Two optimizer steps per rollout, so the second one has ratios != 1, clipping and KL.

    The grads compared are the second step's. adam_eps keeps Adam's first-step
    normalisation (g / |g|) from blowing float noise in near-zero grads up to full steps.
    """
    samples = make_samples(8, seed=3, with_rollout=True)
    algo = FULL_ALGO | {"loss_reduction": reduction, "advantage_estimator": estimator}
    if estimator == "gspo":  # sequence ratios move little: GSPO's own clip range is tiny
        algo |= {"eps_clip": 3e-3, "eps_clip_high": 4e-3}
    optim = {"lr": 0.02, "adam_eps": 1e-4}
    results = {}
    for name, layout in LAYOUTS.items():
        t = trainer(tiny_model_dir, *make_configs(4, algo=algo, optim=optim, train=layout))
        metrics = t.train_step(samples)
        results[name] = (metrics, grads(t))
    ref_metrics, ref_grads = results["one_by_one"]
    assert results["packed_capped"][0]["train/micro_batches"] > 2
    assert ref_metrics["train/clipfrac"] > 0 and ref_metrics["train/kl"] > 0
    keys = ["loss", "pg_loss", "kl", "entropy", "clipfrac", "ppo_kl", "is_weight", "grad_norm"]
    for name, (metrics, g) in results.items():
        for key in keys:
            expected = ref_metrics[f"train/{key}"]
            assert metrics[f"train/{key}"] == pytest.approx(expected, rel=1e-5, abs=1e-7), (
                name,
                key,
            )
        for a, b in zip(g, ref_grads, strict=True):
            # float32 summation order differs with the micro-batching
            assert torch.allclose(a, b, atol=2e-6, rtol=1e-4), (name, (a - b).abs().max())


def test_shared_prompts_train_the_same_as_unshared(
    tiny_model_dir: Path, make_groups: Samples, make_configs: Configs
) -> None:
    """A group's samples share one copy of their prompt in the packed row: the same loss,
    metrics and grads as each sample with its own copy, over two optimizer steps (the second
    with ratios != 1, clipping and KL) and capped micro-batches that split the groups."""
    samples = make_groups(4, 4, seed=5, with_rollout=True)
    train = {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 48}
    configs = make_configs(8, algo=FULL_ALGO, optim={"lr": 0.02, "adam_eps": 1e-4}, train=train)
    results = []
    for share in (False, True):
        t = TorchTrainer(tiny_model_dir, *configs, num_threads=1, share_prompts=share)
        results.append((t.train_step(samples), grads(t)))
    (metrics, g), (shared_metrics, shared_g) = results
    assert metrics["train/micro_batches"] > 2 and metrics["train/clipfrac"] > 0
    micros = [m for plan in t.plan_steps(samples) for m in plan.micro_batches]
    shared = [pack_samples([samples[i] for i in m], share_prompts=True).shared for m in micros]
    assert any(shared) and not all(shared)
    for key in ["loss", "pg_loss", "kl", "entropy", "clipfrac", "is_weight", "grad_norm"]:
        assert shared_metrics[f"train/{key}"] == pytest.approx(metrics[f"train/{key}"], rel=1e-5)
    for a, b in zip(g, shared_g, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4), (a - b).abs().max()


def test_token_mean_and_sample_mean_differ(
    tiny_model_dir: Path, make_samples: Samples, make_configs: Configs
) -> None:
    samples = make_samples(8, seed=3)
    losses = [
        trainer(
            tiny_model_dir, *make_configs(8, algo={"loss_reduction": r, "entropy_coef": 0.1})
        ).train_step(samples)["train/loss"]
        for r in ("sample_mean", "token_mean")
    ]
    assert losses[0] != pytest.approx(losses[1])


def toy_group() -> list[TrainSample]:
    """One prompt, a rewarded answer and a penalised one, four times each."""
    prompt = [5, 6, 7, 8]
    good, bad = [20, 21, 22], [30, 31, 32]
    return [TrainSample(prompt + good, 3, 1.0)] * 4 + [TrainSample(prompt + bad, 3, -1.0)] * 4


def test_training_raises_the_rewarded_logprob(tiny_model_dir: Path, make_configs: Configs) -> None:
    algo, optim, train = make_configs(8, optim={"lr": 3e-3})
    t = trainer(tiny_model_dir, algo, optim, train)
    batch = toy_group()
    before = [float(lp.sum()) for lp in t.compute_logprobs([batch[0], batch[4]])]
    losses = [t.train_step(batch)["train/loss"] for _ in range(5)]
    after = [float(lp.sum()) for lp in t.compute_logprobs([batch[0], batch[4]])]
    assert after[0] > before[0] + 1.0
    assert after[1] < before[1] - 1.0
    assert all(abs(loss) < 1e-5 for loss in losses)  # on-policy GRPO: ratio 1, zero-mean A


def test_kl_loss_pulls_towards_the_reference(tiny_model_dir: Path, make_configs: Configs) -> None:
    batch = toy_group()
    drift = {}
    for coef in (0.0, 5.0):
        kl = {"use_kl_loss": True, "kl_loss_coef": coef, "kl_loss_type": "k2"}
        if not coef:  # the KL weighs nothing: measured only when asked
            kl["kl_metric_interval"] = 1
        algo, optim, train = make_configs(8, algo=kl)
        t = trainer(tiny_model_dir, algo, optim, train)
        kls = [t.train_step(batch)["train/kl"] for _ in range(4)]
        drift[coef] = kls[-1]
        ref = t.compute_logprobs(batch[:1], "ref")[0]
        fresh = trainer(tiny_model_dir, algo, optim, train).compute_logprobs(batch[:1])[0]
        assert torch.allclose(ref, fresh)  # the reference never moves
    assert drift[5.0] < drift[0.0]


def test_several_optimizer_steps_per_rollout(
    tiny_model_dir: Path, make_samples: Samples, make_configs: Configs
) -> None:
    algo, optim, train = make_configs(4, optim={"lr_warmup_steps": 4})
    t = trainer(tiny_model_dir, algo, optim, train)
    metrics = t.train_step(make_samples(12, seed=5))
    assert metrics["train/optimizer_steps"] == 3.0
    assert t.step == 3
    assert metrics["train/lr"] == pytest.approx(optim.lr * 3 / 4)
    assert metrics["train/ppo_kl"] != 0.0  # later steps see a policy that moved


def test_rollout_must_fill_whole_optimizer_steps(
    tiny_model_dir: Path, make_samples: Samples, make_configs: Configs
) -> None:
    t = trainer(tiny_model_dir, *make_configs(4))
    with pytest.raises(ValueError, match="global_batch_size=4"):
        t.train_step(make_samples(6))
    with pytest.raises(ValueError, match="reference model"):
        t.compute_logprobs(make_samples(1), "ref")


def test_export_hf_round_trips(
    tiny_model_dir: Path, make_samples: Samples, make_configs: Configs, tmp_path: Path
) -> None:
    t = trainer(tiny_model_dir, *make_configs(4, optim={"lr": 1e-2}))
    samples = make_samples(4, seed=7)
    t.train_step(samples)
    out = t.export_hf(tmp_path / "weights")
    t.export_hf(tmp_path / "weights")  # replacing an existing export works
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert (out / "tokenizer.json").is_file()
    assert "attn" not in (out / "config.json").read_text()  # engines pick their own
    assert AutoTokenizer.from_pretrained(out).eos_token == "<eos>"
    packed = pack_samples(samples)
    (trained,) = t.compute_logprobs(samples[:1])
    with torch.no_grad():
        exported = forward_tokens(reloaded, pack_samples(samples[:1]), 0.8).logp
        assert torch.allclose(exported, trained, atol=1e-6)
        original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        before, after = (forward_tokens(m, packed, 0.8).logp for m in (original, reloaded))
        assert not torch.allclose(before, after, atol=1e-4)
    assert [p.name for p in tmp_path.iterdir()] == ["weights"]


def test_export_hf_writes_each_shard_as_its_buckets_arrive(
    tiny_model_dir: Path, make_configs: Configs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 never holds the whole model: with small buckets and shards, shards are on disk
    before the last bucket is gathered, and the folder equals the model's weights."""
    import functools

    from rlpost.backends.hf_folder import staging_folders
    from rlpost.backends.hf_load import read_weights
    from rlpost.backends.megatron.hf_files import write_hf_folder
    from rlpost.backends.torch_trainer import trainer as trainer_module

    t = trainer(tiny_model_dir, *make_configs(4))
    out = tmp_path / "weights"
    monkeypatch.setattr(
        trainer_module, "write_hf_folder", functools.partial(write_hf_folder, shard_bytes=16 << 10)
    )
    shards_seen: list[int] = []
    iterate = t.iter_hf_weights

    def watched(bucket_bytes: int = 0) -> Any:
        for bucket in iterate(bucket_bytes=8 << 10):
            shards_seen.append(
                sum(len(list(f.glob("*.safetensors"))) for f in staging_folders(out))
            )
            yield bucket

    monkeypatch.setattr(t, "iter_hf_weights", watched)
    t.export_hf(out)
    assert len(shards_seen) > 4 and shards_seen[0] == 0 and shards_seen[-1] > 1, shards_seen
    assert not staging_folders(out)
    exported = read_weights(out, torch.float32)
    held = {n: full_tensor(p.detach()) for n, p in t.model.named_parameters()}
    assert set(exported) == set(held)
    assert all(torch.equal(exported[n], held[n]) for n in held)


def test_checkpoint_resume_reproduces_training(
    tiny_model_dir: Path, make_samples: Samples, make_configs: Configs
) -> None:
    configs = make_configs(4, optim={"lr_warmup_steps": 3, "weight_decay": 0.1})
    first, second = make_samples(4, seed=8), make_samples(4, seed=9)
    straight = trainer(tiny_model_dir, *configs)
    straight.train_step(first)
    state = copy.deepcopy(straight.state_dict())  # tensors in a state dict alias live ones
    straight.train_step(second)
    resumed = trainer(tiny_model_dir, *configs)
    resumed.load_state_dict(state)
    assert resumed.step == 1
    resumed.train_step(second)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_checkpoint_the_disk_refuses_fails_with_os_error(
    tiny_model_dir: Path, make_configs: Configs, tmp_path: Path
) -> None:
    """The run skips a save that raises OSError (a full disk, a quota) and trains on; the
    write must surface as one, not as torch's own "unexpected pos" RuntimeError."""
    t = trainer(tiny_model_dir, *make_configs(4))
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, limit[1]))
    try:
        with pytest.raises(OSError, match="too large"):
            t.save_checkpoint(tmp_path / "ckpt")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)


# A KL term that weighs nothing, as in the seeds' recipes (use_kl_loss with kl_loss_coef 0)
WEIGHTLESS_KL = {"use_kl_loss": True, "kl_loss_coef": 0.0, "kl_loss_type": "low_var_kl"}
TIMINGS = ("train/time_s", "train/prepare_time_s", "train/samples_per_s", "train/tokens_per_s")


def _same_updates(a: TorchTrainer, b: TorchTrainer, rollouts: list[list[TrainSample]]) -> None:
    for samples in rollouts:
        ma, mb = a.train_step(samples), b.train_step(samples)
        for key in mb.keys() - set(TIMINGS):
            if key.startswith("perf/"):  # measured memory and time, not the update
                continue
            assert mb[key] == pytest.approx(ma[key], rel=1e-6, abs=1e-7), key
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert float((pa - pb).detach().abs().max()) <= 1e-6, name


@pytest.mark.parametrize("gbs", [8, 4], ids=["one-step", "two-steps"])
def test_a_reference_that_weighs_nothing_is_skipped_and_the_updates_do_not_change(
    tiny_model_dir: Path, make_samples: Samples, make_configs: Configs, gbs: int
) -> None:
    """Run (KL measured every rollout, as before) and skipped (not even loaded) train to the
    same weights; only the KL metric is missing, and rollouts the plan marks get it."""
    extra = {"entropy_coef": 0.01, "off_policy_correction": "tis"}
    measured = trainer(
        tiny_model_dir,
        *make_configs(gbs, algo=WEIGHTLESS_KL | extra | {"kl_metric_interval": 1}),
    )
    skipped = trainer(tiny_model_dir, *make_configs(gbs, algo=WEIGHTLESS_KL | extra))
    assert measured.ref_model is not None and skipped.ref_model is None
    rollouts = [make_samples(8, seed=seed, with_rollout=True) for seed in (3, 4)]
    _same_updates(measured, skipped, rollouts)
    assert "train/kl" in measured.train_step(rollouts[0])
    assert "train/kl" not in skipped.train_step(rollouts[0])
    # every N rollouts: loaded, and run only when the loop asks
    assert "train/kl" not in measured.train_step(rollouts[1], with_reference=False)
    with pytest.raises(ValueError, match="no reference model is loaded"):
        skipped.train_step(rollouts[1], with_reference=True)


def test_a_kl_that_weighs_cannot_skip_the_reference(
    tiny_model_dir: Path, make_samples: Samples, make_configs: Configs
) -> None:
    t = trainer(tiny_model_dir, *make_configs(8, algo=FULL_ALGO))
    with pytest.raises(ValueError, match="cannot skip the reference forward"):
        t.train_step(make_samples(8, seed=3, with_rollout=True), with_reference=False)


def test_old_logprobs_from_the_training_forward_give_the_same_updates(
    tiny_model_dir: Path, make_samples: Samples, make_configs: Configs
) -> None:
    """One optimizer step per rollout: the training forward's detached logprobs stand in for
    the old-policy forward, with TIS and a KL loss in play."""
    configs = make_configs(8, algo=FULL_ALGO)
    recomputed = TorchTrainer(
        tiny_model_dir, *configs, num_threads=1, reuse_logprobs_single_step=False
    )
    reused = TorchTrainer(tiny_model_dir, *configs, num_threads=1)
    rollouts = [make_samples(8, seed=seed, with_rollout=True) for seed in (5, 6)]
    _same_updates(recomputed, reused, rollouts)


def test_recomputed_layers_train_the_same(
    tiny_model_dir: Path, make_samples: Samples, make_configs: Configs
) -> None:
    """Activation checkpointing (recompute full) changes memory, not results: the same
    logprobs, loss and gradients, while every decoder layer runs again in the backward."""
    configs = make_configs(4, algo=FULL_ALGO, optim={"lr": 0.02, "adam_eps": 1e-4})
    samples = make_samples(8, seed=3, with_rollout=True)
    results = []
    for recompute in ("none", "full"):
        layout = ParallelLayout.single_process(recompute=recompute)
        t = TorchTrainer(tiny_model_dir, *configs, num_threads=1, layout=layout)
        calls: list[object] = []
        for layer in decoder_layers(t.model):
            layer.register_forward_pre_hook(lambda module, _, seen=calls: seen.append(module))
        (logp,) = t.compute_logprobs(samples[:1])
        before = len(calls)
        metrics = t.train_step(samples)
        results.append((logp, metrics, grads(t), len(calls) - before))
    (logp, metrics, g, runs), (ac_logp, ac_metrics, ac_g, ac_runs) = results
    # each training forward's layers run again in its backward (no-grad forwards do not)
    layers = len(decoder_layers(t.model))
    assert ac_runs - runs == layers * metrics["train/micro_batches"] > 0
    assert torch.equal(ac_logp, logp)
    for key in ["loss", "pg_loss", "kl", "entropy", "clipfrac", "grad_norm"]:
        assert ac_metrics[f"train/{key}"] == pytest.approx(metrics[f"train/{key}"], rel=1e-6)
    for a, b in zip(g, ac_g, strict=True):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-5), (a - b).abs().max()


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize(
    ("reshard", "gathered"), [(None, True), (True, False), (False, True)], ids=str
)
def test_reshard_after_forward_decides_what_stays_gathered_for_the_backward(
    tiny_model_dir: Path,
    make_samples: Samples,
    make_configs: Configs,
    reshard: bool | None,
    gathered: bool,
    recompute: str,
) -> None:
    """`layout.train.fsdp.reshard_after_forward`: when the final norm runs (every decoder
    layer's forward done, the backward next), each decoder layer's parameters are still the
    gathered tensors (false, and the CPU default: one FSDP2 unit) or back to their DTensor
    shards (true: a unit per layer, each gathered again for its backward); the step is the
    same either way, with each layer recomputed in its backward or not."""
    from torch.distributed.tensor import DTensor

    from rlpost.schema.layout import FsdpLayout

    configs = make_configs(4, algo=FULL_ALGO, optim={"lr": 0.02, "adam_eps": 1e-4})
    samples = make_samples(8, seed=3, with_rollout=True)
    fsdp = FsdpLayout(reshard_after_forward=reshard)
    layout = ParallelLayout.single_process(recompute=recompute)
    t = TorchTrainer(tiny_model_dir, *configs, num_threads=1, fsdp=fsdp, layout=layout)
    layers = decoder_layers(t.model)
    seen: list[bool] = []

    def at_the_end(*_: object) -> None:
        if torch.is_grad_enabled():
            params = [p for layer in layers for p in layer.parameters()]
            seen.append(not any(isinstance(p, DTensor) for p in params))
            assert all(isinstance(p, DTensor) for p in params) != seen[-1]

    t.model.model.norm.register_forward_pre_hook(at_the_end)  # Qwen3's final norm
    metrics = t.train_step(samples)
    assert seen == [gathered] * int(metrics["train/micro_batches"]) and seen
    reference = TorchTrainer(tiny_model_dir, *configs, num_threads=1)
    want = reference.train_step(samples)
    for key in ["loss", "pg_loss", "kl", "entropy", "grad_norm"]:
        assert metrics[f"train/{key}"] == pytest.approx(want[f"train/{key}"], rel=1e-6), key
    for a, b in zip(grads(t), grads(reference), strict=True):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-5), (a - b).abs().max()


def test_the_layers_compute_in_the_dtype_the_trainer_is_given(
    tiny_model_dir: Path, make_configs: Configs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compute_dtype (model.params_dtype on GPUs) reaches FSDP2's precision policy for the
    policy and the reference; on CPU that policy is float32 whatever it says."""
    asked: list[tuple[str, str]] = []
    chosen = distributed.mixed_precision

    def recording(device_type: str, compute_dtype: str) -> MixedPrecisionPolicy:
        asked.append((device_type, compute_dtype))
        return chosen(device_type, compute_dtype)

    monkeypatch.setattr(distributed, "mixed_precision", recording)
    kl = {"use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": "k2"}
    algo, optim, train = make_configs(4, algo=kl)
    t = TorchTrainer(tiny_model_dir, algo, optim, train, num_threads=1, compute_dtype="fp32")
    assert t.ref_model is not None
    assert asked == [("cpu", "fp32"), ("cpu", "fp32")]  # the policy, then the reference
    float32 = MixedPrecisionPolicy()
    assert chosen("cpu", "bf16") == chosen("cuda", "fp32") == float32
    assert chosen("cuda", "bf16") == MixedPrecisionPolicy(torch.bfloat16, torch.float32)
    with pytest.raises(ValueError, match="bf16 or fp32, not fp16"):
        chosen("cuda", "fp16")
