"""From rewards to token-level advantages: group baselines, returns, whitening.

Two stages. `normalize_rewards` turns raw rewards into one scalar per sample using its group
(the runtime calls it once a rollout is scored). `compute_advantages` turns those scalars into
one advantage per response token, inside the trainer, where per-token KL is known.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.schema import AlgoConfig

GROUP_STD_EPS = 1e-6
WHITEN_EPS = 1e-8

RewardShaper = Callable[[Tensor, AlgoConfig], Tensor]
TokenAdvantageFn = Callable[
    [Sequence[float], Sequence[Tensor], Sequence[Tensor], AlgoConfig], list[Tensor]
]
# Sums (masked count, sum, sum of squares) across data-parallel ranks; identity on one rank.
MomentReducer = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class AdvantageEstimator:
    """One named estimator: how it baselines a group, then spreads advantage over tokens."""

    name: str
    shape_group: RewardShaper
    token_advantages: TokenAdvantageFn
    policy_loss: str = "ppo_clip"
    uses_kl: bool = False
    always_whiten: bool = False

    def __call__(
        self,
        rewards: Sequence[float],
        kls: Sequence[Tensor],
        masks: Sequence[Tensor],
        algo: AlgoConfig,
    ) -> list[Tensor]:
        return self.token_advantages(rewards, kls, masks, algo)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def advantage_estimator(
    name: str,
    *,
    shape_group: RewardShaper,
    policy_loss: str = "ppo_clip",
    uses_kl: bool = False,
    always_whiten: bool = False,
) -> Callable[[TokenAdvantageFn], TokenAdvantageFn]:
    """Register a token-advantage function under `name` with its group baseline."""

    def register(fn: TokenAdvantageFn) -> TokenAdvantageFn:
        ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(
            name, shape_group, fn, policy_loss, uses_kl, always_whiten
        )
        return fn

    return register


def get_estimator(name: str) -> AdvantageEstimator:
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        known = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
        raise ValueError(
            f"algo.advantage_estimator={name!r} is not registered; known: {known}"
        ) from None


# ---- group baselines (rows are groups) -------------------------------------------------------


def center_and_scale(groups: Tensor, algo: AlgoConfig) -> Tensor:
    centered = groups - groups.mean(dim=1, keepdim=True)
    if not algo.grpo_std_normalization or groups.shape[1] < 2:
        return centered
    return centered / (groups.std(dim=1, keepdim=True) + GROUP_STD_EPS)


def center(groups: Tensor, algo: AlgoConfig) -> Tensor:
    return groups - groups.mean(dim=1, keepdim=True)


def keep_raw(groups: Tensor, algo: AlgoConfig) -> Tensor:
    return groups


def normalize_rewards(rewards: Sequence[float], group_size: int, algo: AlgoConfig) -> list[float]:
    """Per-group reward post-processing for `algo.advantage_estimator`.

    Rewards are laid out group after group. A group whose rewards are all equal carries no
    signal and gets exactly zero under every baseline (rounding in mean/std would otherwise
    leave ~1e-8 noise that the std division can blow up).
    """
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(
            f"{len(rewards)} rewards do not split into groups of {group_size}; "
            "pass rewards group after group with n_samples_per_prompt each"
        )
    estimator = get_estimator(algo.advantage_estimator)
    groups = torch.tensor(rewards, dtype=torch.float64).view(-1, group_size)
    shaped = estimator.shape_group(groups, algo)
    if estimator.shape_group is not keep_raw:
        flat = (groups.amax(dim=1) == groups.amin(dim=1)).unsqueeze(1)
        shaped = shaped.masked_fill(flat, 0.0)
    return shaped.flatten().tolist()


# ---- token advantages ------------------------------------------------------------------------


def broadcast(value: float, mask: Tensor) -> Tensor:
    return torch.full(mask.shape, value, dtype=torch.float32) * mask


def discounted_returns(token_rewards: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_{t+1}, computed right to left."""
    returns = torch.empty_like(token_rewards)
    running = torch.zeros((), dtype=token_rewards.dtype)
    for t in range(token_rewards.shape[0] - 1, -1, -1):
        running = token_rewards[t] + gamma * running
        returns[t] = running
    return returns


@advantage_estimator("grpo", shape_group=center_and_scale)
def grpo_advantages(
    rewards: Sequence[float], kls: Sequence[Tensor], masks: Sequence[Tensor], algo: AlgoConfig
) -> list[Tensor]:
    return [broadcast(r, m) for r, m in zip(rewards, masks, strict=True)]


@advantage_estimator("gspo", shape_group=center, policy_loss="gspo")
def gspo_advantages(
    rewards: Sequence[float], kls: Sequence[Tensor], masks: Sequence[Tensor], algo: AlgoConfig
) -> list[Tensor]:
    return [broadcast(r, m) for r, m in zip(rewards, masks, strict=True)]


@advantage_estimator("reinforce_plus_plus", shape_group=keep_raw, uses_kl=True, always_whiten=True)
def reinforce_pp_advantages(
    rewards: Sequence[float], kls: Sequence[Tensor], masks: Sequence[Tensor], algo: AlgoConfig
) -> list[Tensor]:
    """Returns of per-token rewards: -kl_coef*KL on every token, the reward on the last."""
    out = []
    for reward, kl, mask in zip(rewards, kls, masks, strict=True):
        token_rewards = -algo.kl_coef * kl.float() * mask
        token_rewards[-1] += reward
        out.append(discounted_returns(token_rewards, algo.gamma) * mask)
    return out


@advantage_estimator(
    "reinforce_plus_plus_baseline", shape_group=center, uses_kl=True, always_whiten=True
)
def reinforce_pp_baseline_advantages(
    rewards: Sequence[float], kls: Sequence[Tensor], masks: Sequence[Tensor], algo: AlgoConfig
) -> list[Tensor]:
    return [
        (broadcast(r, m) - algo.kl_coef * kl.float()) * m
        for r, kl, m in zip(rewards, kls, masks, strict=True)
    ]


# ---- whitening and the entry point -----------------------------------------------------------


def whiten(
    values: Sequence[Tensor], masks: Sequence[Tensor], reduce: MomentReducer | None = None
) -> list[Tensor]:
    """Zero mean, unit variance over all loss tokens of the batch (all ranks via `reduce`)."""
    moments = torch.zeros(3, dtype=torch.float64)
    for v, m in zip(values, masks, strict=True):
        v64, m64 = v.double(), m.double()
        moments += torch.stack([m64.sum(), (v64 * m64).sum(), (v64 * v64 * m64).sum()])
    if reduce is not None:
        moments = reduce(moments)
    count, total, total_sq = moments.tolist()
    if count == 0:
        return [v.clone() for v in values]
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0)
    scale = (var + WHITEN_EPS) ** -0.5
    return [((v.double() - mean) * scale).float() * m for v, m in zip(values, masks, strict=True)]


def compute_advantages(
    rewards: Sequence[float],
    masks: Sequence[Tensor],
    algo: AlgoConfig,
    kls: Sequence[Tensor] | None = None,
    reduce: MomentReducer | None = None,
) -> list[Tensor]:
    """Token advantages for one batch of samples (their normalized rewards and loss masks).

    `kls` is the per-token KL of the rollout policy to the reference, needed by estimators
    with `uses_kl` when `algo.kl_coef` > 0; zeros are assumed when it is None.
    """
    estimator = get_estimator(algo.advantage_estimator)
    masks = [m.float() for m in masks]
    if kls is None:
        kls = [torch.zeros_like(m) for m in masks]
    advantages = estimator(rewards, kls, masks, algo)
    if estimator.always_whiten or algo.normalize_advantages:
        advantages = whiten(advantages, masks, reduce)
    return advantages


def needs_reference_kl(algo: AlgoConfig) -> bool:
    """Whether advantages need the reference model's logprobs (the estimator puts a KL
    penalty into the reward: AlgoConfig.kl_in_reward, which the plan reads too)."""
    return algo.kl_in_reward
