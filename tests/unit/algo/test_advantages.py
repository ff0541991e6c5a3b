import math

import pytest
import torch
from pydantic import ValidationError

from rlpost.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    discounted_returns,
    needs_reference_kl,
    normalize_rewards,
    whiten,
)
from rlpost.schema import AlgoConfig

ESTIMATORS = ["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]


def algo(**kwargs: object) -> AlgoConfig:
    if kwargs.get("advantage_estimator") == "gspo":
        kwargs.setdefault("eps_clip", 3e-4)  # gspo's own range: a token-level one is refused
    return AlgoConfig(**kwargs)


def test_every_configurable_estimator_is_registered() -> None:
    assert sorted(ADVANTAGE_ESTIMATORS) == sorted(ESTIMATORS)
    assert ADVANTAGE_ESTIMATORS["gspo"].policy_loss == "gspo"
    assert ADVANTAGE_ESTIMATORS["grpo"].policy_loss == "ppo_clip"


def test_grpo_rewards_are_centered_and_scaled_per_group() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0, 2.0]
    out = normalize_rewards(rewards, 4, algo(advantage_estimator="grpo"))
    std = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    assert out[:4] == pytest.approx([x / (std + 1e-6) for x in (0.5, -0.5, -0.5, 0.5)])
    std2 = math.sqrt(2 / 3)  # [3, 1, 2, 2]: mean 2
    assert out[4:] == pytest.approx([1 / (std2 + 1e-6), -1 / (std2 + 1e-6), 0.0, 0.0])


def test_grpo_without_std_normalization_only_centers() -> None:
    out = normalize_rewards([1.0, 0.0, 0.0, 0.0], 4, algo(grpo_std_normalization=False))
    assert out == pytest.approx([0.75, -0.25, -0.25, -0.25])


@pytest.mark.parametrize("name", ["gspo", "reinforce_plus_plus_baseline"])
def test_mean_baseline_estimators_only_center(name: str) -> None:
    out = normalize_rewards([2.0, 0.0, 1.0, 5.0], 2, algo(advantage_estimator=name))
    assert out == pytest.approx([1.0, -1.0, -2.0, 2.0])


def test_reinforce_plus_plus_keeps_raw_rewards() -> None:
    rewards = [0.3, 0.3, 1.0, 0.0]
    assert normalize_rewards(rewards, 2, algo(advantage_estimator="reinforce_plus_plus")) == rewards


@pytest.mark.parametrize("name", ["grpo", "gspo", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("value", [0.1, 1.0, -0.7, 1e-3])
def test_group_with_equal_rewards_gets_exactly_zero(name: str, value: float) -> None:
    out = normalize_rewards([value] * 8 + [0.0, 1.0] * 4, 8, algo(advantage_estimator=name))
    assert out[:8] == [0.0] * 8
    assert all(v != 0.0 for v in out[8:])
    masks = [torch.ones(3) for _ in out[:8]]
    assert all(torch.equal(a, torch.zeros(3)) for a in compute_advantages(out[:8], masks, algo()))


def test_reward_count_must_split_into_groups() -> None:
    with pytest.raises(ValueError, match="groups of 4"):
        normalize_rewards([1.0] * 6, 4, algo())


def test_grpo_broadcasts_reward_over_loss_tokens() -> None:
    masks = [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0])]
    out = compute_advantages([0.5, -2.0], masks, algo())
    assert torch.equal(out[0], torch.tensor([0.5, 0.0, 0.5]))
    assert torch.equal(out[1], torch.tensor([-2.0]))


def test_discounted_returns_by_hand() -> None:
    returns = discounted_returns(torch.tensor([1.0, 2.0, 4.0]), 0.5)
    assert returns.tolist() == [1.0 + 0.5 * (2.0 + 0.5 * 4.0), 2.0 + 0.5 * 4.0, 4.0]


def test_reinforce_plus_plus_returns_by_hand_on_three_tokens() -> None:
    config = algo(advantage_estimator="reinforce_plus_plus", kl_coef=0.5, gamma=0.9)
    kl = torch.tensor([0.1, 0.2, 0.3])
    mask = torch.ones(3)
    raw = ADVANTAGE_ESTIMATORS["reinforce_plus_plus"]([1.0], [kl], [mask], config)[0]
    # token rewards: -0.05, -0.1, -0.15 + 1 = 0.85
    g2 = 0.85
    g1 = -0.1 + 0.9 * g2
    g0 = -0.05 + 0.9 * g1
    assert raw.tolist() == pytest.approx([g0, g1, g2])
    whitened = compute_advantages([1.0], [mask], config, kls=[kl])[0]
    expected = torch.tensor([g0, g1, g2], dtype=torch.float64)
    expected = (expected - expected.mean()) / torch.sqrt(expected.var(unbiased=False) + 1e-8)
    assert whitened.tolist() == pytest.approx(expected.tolist(), abs=1e-6)


def test_reinforce_plus_plus_baseline_subtracts_token_kl_then_whitens() -> None:
    config = algo(advantage_estimator="reinforce_plus_plus_baseline", kl_coef=1.0)
    kls = [torch.tensor([0.0, 1.0]), torch.tensor([0.5])]
    masks = [torch.ones(2), torch.ones(1)]
    raw = ADVANTAGE_ESTIMATORS["reinforce_plus_plus_baseline"]([1.0, -1.0], kls, masks, config)
    assert torch.cat(raw).tolist() == pytest.approx([1.0, 0.0, -1.5])
    out = torch.cat(compute_advantages([1.0, -1.0], masks, config, kls=kls))
    assert float(out.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(out.var(unbiased=False)) == pytest.approx(1.0, abs=1e-5)


def test_whitening_ignores_masked_tokens() -> None:
    values = [torch.tensor([1.0, 100.0, 3.0])]
    masks = [torch.tensor([1.0, 0.0, 1.0])]
    out = whiten(values, masks)[0]
    assert out.tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)


def test_whitening_with_a_reducer_matches_the_whole_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(n, generator=gen) for n in (3, 5, 2, 7)]
    masks = [(torch.rand(n, generator=gen) > 0.3).float() for n in (3, 5, 2, 7)]
    whole = whiten(values, masks)

    def moments(vs: list[torch.Tensor], ms: list[torch.Tensor]) -> torch.Tensor:
        captured: list[torch.Tensor] = []
        whiten(vs, ms, reduce=lambda m: captured.append(m.clone()) or m)
        return captured[0]

    # Two "ranks", each holding half the samples, sum their moments.
    other = {0: moments(values[2:], masks[2:]), 1: moments(values[:2], masks[:2])}
    first = whiten(values[:2], masks[:2], reduce=lambda m: m + other[0])
    second = whiten(values[2:], masks[2:], reduce=lambda m: m + other[1])
    for a, b in zip(whole, first + second, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_normalize_advantages_whitens_grpo() -> None:
    masks = [torch.ones(2), torch.ones(2)]
    plain = compute_advantages([1.0, 3.0], masks, algo())
    whitened = compute_advantages([1.0, 3.0], masks, algo(normalize_advantages=True))
    assert torch.cat(plain).tolist() == [1.0, 1.0, 3.0, 3.0]
    assert torch.cat(whitened).tolist() == pytest.approx([-1.0, -1.0, 1.0, 1.0], abs=1e-6)


def test_reference_kl_needed_only_by_kl_estimators_with_a_coefficient() -> None:
    with pytest.raises(ValidationError, match="does not put a KL penalty into the reward"):
        algo(kl_coef=0.1)  # grpo: the coefficient would be ignored, so it is refused
    assert not needs_reference_kl(algo(advantage_estimator="reinforce_plus_plus"))
    assert needs_reference_kl(algo(advantage_estimator="reinforce_plus_plus", kl_coef=0.1))


def test_the_schema_knows_what_each_estimator_reads() -> None:
    from rlpost.algo.advantages import center_and_scale, keep_raw
    from rlpost.schema import algo

    assert set(algo.AdvantageEstimatorName.__args__) == set(ADVANTAGE_ESTIMATORS)
    for name, estimator in ADVANTAGE_ESTIMATORS.items():
        assert (name in algo.KL_REWARD_ESTIMATORS) == estimator.uses_kl
        assert (name in algo.WHITENING_ESTIMATORS) == estimator.always_whiten
        baseline = estimator.shape_group is not keep_raw
        assert (name in algo.GROUP_BASELINE_ESTIMATORS) == baseline
        scaled = estimator.shape_group is center_and_scale
        assert (name in algo.STD_SCALING_ESTIMATORS) == scaled
