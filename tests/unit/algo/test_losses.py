import math

import pytest
import torch

from rlpost.algo.losses import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    LossInputs,
    clipped_surrogate,
    compute_kl,
    compute_loss,
    entropy_from_logits,
    importance_weights,
    reduction_weights,
)
from rlpost.schema import AlgoConfig


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("k1", 0.5),
        ("k2", 0.125),
        ("k3", math.exp(-0.5) - 1 + 0.5),
        ("low_var_kl", math.exp(-0.5) - 1 + 0.5),
    ],
)
def test_kl_estimators_by_hand(kind: str, expected: float) -> None:
    assert float(compute_kl(t(-1.0), t(-1.5), kind)) == pytest.approx(expected, rel=1e-6)


def test_k3_is_nonnegative_and_clamped() -> None:
    kl = compute_kl(t(-20.0, 0.0, -1.0), t(0.0, -20.0, -1.0), "low_var_kl")
    assert kl.tolist() == pytest.approx([10.0, 10.0, 0.0])
    assert sorted(KL_ESTIMATORS) == ["k1", "k2", "k3", "low_var_kl"]


RATIOS = t(1.5, 0.5, 0.5, 1.5, 4.0, 1.1)
ADVANTAGES = t(1.0, 1.0, -1.0, -1.0, -1.0, 2.0)


def test_clipped_surrogate_with_asymmetric_clip_by_hand() -> None:
    config = AlgoConfig(eps_clip=0.2, eps_clip_high=0.28)
    log_ratio = RATIOS.log().requires_grad_()
    terms = clipped_surrogate(log_ratio, ADVANTAGES, config)
    # r=1.5,A=1 clips at 1.28; r=0.5,A=1 keeps -0.5; r=0.5,A=-1 clips at 0.8;
    # r=1.5,A=-1 keeps 1.5; r=4,A=-1 keeps 4 (no dual clip); r=1.1,A=2 inside the band.
    assert terms.loss.tolist() == pytest.approx([-1.28, -0.5, 0.8, 1.5, 4.0, -2.2], rel=1e-6)
    assert terms.clipped.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    terms.loss.sum().backward()
    # d(-r A)/d log r = -r A where unclipped, zero where the clip decided.
    expected = [0.0, -0.5, 0.0, 1.5, 4.0, -2.2]
    assert log_ratio.grad.tolist() == pytest.approx(expected, rel=1e-6)


def test_symmetric_clip_when_high_is_unset() -> None:
    terms = clipped_surrogate(t(1.5).log(), t(1.0), AlgoConfig(eps_clip=0.2))
    assert float(terms.loss) == pytest.approx(-1.2)


def test_dual_clip_bounds_negative_advantage_tokens() -> None:
    config = AlgoConfig(eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=3.0)
    log_ratio = RATIOS.log().requires_grad_()
    terms = clipped_surrogate(log_ratio, ADVANTAGES, config)
    assert terms.loss.tolist() == pytest.approx([-1.28, -0.5, 0.8, 1.5, 3.0, -2.2], rel=1e-6)
    assert terms.clipped.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    terms.loss.sum().backward()
    assert float(log_ratio.grad[4]) == 0.0


def test_gspo_uses_the_sequence_mean_log_ratio() -> None:
    config = AlgoConfig(eps_clip=0.99)  # wide enough that nothing here clips
    logp = t(-1.0, -2.0, -3.0, -1.0, -1.0)
    old = t(-1.2, -2.0, -3.0, -1.0, -0.5)
    segments = torch.tensor([0, 0, 0, 1, 1])
    mask = t(1.0, 1.0, 0.0, 1.0, 1.0)
    adv = t(1.0, 1.0, 1.0, -1.0, -1.0)
    terms = POLICY_LOSSES["gspo"](logp, old, adv, segments, mask, config)
    seq0, seq1 = math.exp(0.2 / 2), math.exp(-0.5 / 2)  # masked means of log ratios
    assert terms.loss.tolist() == pytest.approx([-seq0] * 3 + [seq1] * 2, rel=1e-6)
    token = POLICY_LOSSES["ppo_clip"](logp, old, adv, segments, mask, config)
    assert token.loss.tolist() == pytest.approx(
        [-math.exp(0.2), -1.0, -1.0, 1.0, math.exp(-0.5)], rel=1e-6
    )


def test_tis_weight_is_clamped_ratio_of_train_to_rollout() -> None:
    config = AlgoConfig(off_policy_correction="tis", tis_clip_low=0.5, tis_clip_high=2.0)
    weights, cut = importance_weights(t(-1.0, -1.0, -1.0), t(-1.5, -0.8, -3.0), config)
    assert weights.tolist() == pytest.approx([math.exp(0.5), math.exp(-0.2), 2.0], rel=1e-6)
    assert cut.tolist() == [False, False, True]
    assert importance_weights(t(-5.0), t(-1.0), config)[0].tolist() == [0.5]


def test_decoupled_ppo_keeps_weights_and_drops_those_over_the_cap() -> None:
    config = AlgoConfig(off_policy_correction="decoupled_ppo", behaviour_weight_cap=3.0)
    weights, dropped = importance_weights(t(-1.0, -1.0, -1.0), t(-1.5, -0.8, -3.0), config)
    assert weights.tolist() == pytest.approx([math.exp(0.5), math.exp(-0.2), 0.0], rel=1e-6)
    assert dropped.tolist() == [False, False, True]  # exp(2) > 3: an outlier, not trained


def test_the_loss_reports_importance_weights() -> None:
    logp = t(-0.6, -1.2, -0.8, -2.0, -1.5, -0.9)
    inputs = loss_inputs(logp, slice(None), torch.full((6,), 1 / 6))
    out = compute_loss(inputs, FULL, "ppo_clip")
    raw = torch.exp(inputs.old_logp - inputs.rollout_logp)
    assert out.metrics["is_weight"] == pytest.approx(float(raw.clamp(0, 2).mean()), rel=1e-6)
    assert out.metrics["is_clipfrac"] == pytest.approx(float((raw > 2).float().mean()))
    assert out.maxima["is_weight_max"] == pytest.approx(float(raw.max()), rel=1e-6)


def test_entropy_from_logits() -> None:
    assert float(entropy_from_logits(torch.zeros(4))) == pytest.approx(math.log(4))
    assert float(entropy_from_logits(t(0.0, -1e4))) == pytest.approx(0.0, abs=1e-6)


def test_sample_mean_weights_average_within_samples_over_step_samples() -> None:
    segments = torch.tensor([0, 0, 1, 1, 1])
    mask = t(1.0, 1.0, 1.0, 0.0, 1.0)
    weights = reduction_weights(segments, mask, "sample_mean", step_denominator=4.0)
    assert weights.tolist() == pytest.approx([1 / 8, 1 / 8, 1 / 8, 0.0, 1 / 8])


def test_token_mean_weights_divide_by_step_tokens() -> None:
    segments = torch.tensor([0, 0, 1])
    weights = reduction_weights(segments, t(1.0, 0.0, 1.0), "token_mean", step_denominator=10.0)
    assert weights.tolist() == pytest.approx([0.1, 0.0, 0.1])


def loss_inputs(logp: torch.Tensor, rows: slice, weights: torch.Tensor) -> LossInputs:
    old = t(-1.0, -1.2, -0.4, -2.0, -1.5, -0.9)
    ref = t(-1.1, -1.0, -0.5, -2.5, -1.0, -1.0)
    rollout = t(-1.0, -1.3, -0.5, -2.0, -1.4, -0.9)
    adv = t(1.0, 1.0, -1.0, -1.0, 0.5, 0.5)
    entropy = t(2.0, 1.5, 1.0, 0.5, 0.2, 0.1)
    segments = torch.tensor([0, 0, 1, 1, 2, 2])
    mask = torch.ones(6)
    ids = segments[rows] - segments[rows].min()
    return LossInputs(
        logp[rows],
        old[rows],
        adv[rows],
        weights[rows],
        ids,
        mask[rows],
        entropy[rows],
        ref[rows],
        rollout[rows],
    )


FULL = AlgoConfig(
    use_kl_loss=True,
    kl_loss_coef=0.1,
    kl_loss_type="k2",
    entropy_coef=0.01,
    eps_clip=0.2,
    eps_clip_high=0.28,
    eps_clip_c=3.0,
    off_policy_correction="tis",
)


def test_total_loss_combines_terms_with_weights_by_hand() -> None:
    logp = t(-0.6, -1.2, -0.8, -2.0, -1.5, -0.9)
    weights = torch.full((6,), 1 / 6)
    out = compute_loss(loss_inputs(logp, slice(None), weights), FULL, "ppo_clip")
    inputs = loss_inputs(logp, slice(None), weights)
    ratio = torch.exp(logp - inputs.old_logp)
    clipped = ratio.clamp(0.8, 1.28)
    pg = torch.maximum(-ratio * inputs.advantages, -clipped * inputs.advantages)
    pg = torch.where(inputs.advantages < 0, torch.minimum(pg, -3.0 * inputs.advantages), pg)
    pg = pg * torch.exp(inputs.old_logp - inputs.rollout_logp).clamp(0.0, 2.0)
    kl = (logp - inputs.ref_logp).square() / 2
    total = pg - 0.01 * inputs.entropy + 0.1 * kl
    assert float(out.loss) == pytest.approx(float(total.mean()), rel=1e-6)
    assert out.metrics["pg_loss"] == pytest.approx(float(pg.mean()), rel=1e-6)
    assert out.metrics["kl"] == pytest.approx(float(kl.mean()), rel=1e-6)
    assert out.metrics["entropy"] == pytest.approx(float(inputs.entropy.mean()), rel=1e-6)
    assert out.metrics["clipfrac"] == pytest.approx(2 / 6)  # token 0 clips high, token 2 low


@pytest.mark.parametrize("kind", ["ppo_clip", "gspo"])
def test_loss_and_grads_split_over_micro_batches_sum_to_the_whole(kind: str) -> None:
    base = t(-0.6, -1.2, -0.8, -2.0, -1.5, -0.9)
    weights = torch.full((6,), 1 / 3) * t(0.5, 0.5, 0.5, 0.5, 0.5, 0.5)
    whole_logp = base.clone().requires_grad_()
    whole = compute_loss(loss_inputs(whole_logp, slice(None), weights), FULL, kind)
    whole.loss.backward()
    split_logp = base.clone().requires_grad_()
    parts = [
        compute_loss(loss_inputs(split_logp, s, weights), FULL, kind)
        for s in (slice(0, 4), slice(4, 6))
    ]
    sum(p.loss for p in parts).backward()
    assert float(sum(p.loss.detach() for p in parts)) == pytest.approx(
        float(whole.loss.detach()), rel=1e-6
    )
    assert torch.allclose(split_logp.grad, whole_logp.grad, atol=1e-7)
    for name, value in whole.metrics.items():
        assert sum(p.metrics[name] for p in parts) == pytest.approx(value, rel=1e-5, abs=1e-9)


def test_tis_without_rollout_logprobs_is_an_error() -> None:
    inputs = loss_inputs(t(-1.0, -1.0, -1.0, -1.0, -1.0, -1.0), slice(None), torch.ones(6))
    bare = LossInputs(**{**inputs.__dict__, "rollout_logp": None})
    with pytest.raises(ValueError, match="off_policy_correction=tis"):
        compute_loss(bare, FULL, "ppo_clip")


@pytest.mark.parametrize("policy_loss", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("reduction", ["sample_mean", "token_mean"])
def test_tool_tokens_get_no_gradient_and_count_in_no_metric(
    policy_loss: str, reduction: str
) -> None:
    """Two multi-turn samples: policy, tool (mask 0), policy tokens. Every loss term (policy
    gradient, entropy bonus, KL loss, importance weights) leaves the tool tokens' logprobs
    and entropies without gradient, and changing them changes no metric."""
    from rlpost.algo.steps import SampleTensors, loss_inputs

    algo = AlgoConfig(
        use_kl_loss=True,
        kl_loss_coef=0.1,
        kl_loss_type="low_var_kl",
        entropy_coef=0.01,
        off_policy_correction="tis",
        loss_reduction=reduction,
    )
    masks = [t(1, 1, 0, 0, 0, 1), t(1, 0, 0, 1)]
    rows = [
        SampleTensors(
            mask=mask,
            advantages=torch.full_like(mask, adv),
            old_logp=torch.full_like(mask, -1.0),
            ref_logp=torch.full_like(mask, -1.2),
            rollout_logp=torch.full_like(mask, -0.9),
        )
        for mask, adv in zip(masks, (1.0, -0.5), strict=True)
    ]
    segment_ids = torch.tensor([0] * 6 + [1] * 4)
    tool = torch.cat(masks) == 0

    def run(shift: float) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        base = torch.linspace(-2.0, -0.5, 10)
        logp = (base + shift * tool).requires_grad_(True)  # tool positions moved by `shift`
        entropy = (1.0 + base.abs() + shift * tool).requires_grad_(True)
        inputs = loss_inputs(rows, segment_ids, logp, entropy, algo, denominator=2.0)
        out = compute_loss(inputs, algo, policy_loss)
        out.loss.backward()
        assert logp.grad is not None and entropy.grad is not None
        return logp.grad, entropy.grad, out.metrics

    logp_grad, entropy_grad, metrics = run(0.0)
    assert torch.all(logp_grad[tool] == 0) and torch.all(entropy_grad[tool] == 0)
    assert torch.all(logp_grad[~tool] != 0)
    _, _, moved = run(3.0)
    assert moved == pytest.approx(metrics)
