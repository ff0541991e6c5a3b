"""Per-request sampling parameters (SGLang's names and defaults) and the batched sampler.

Every row of a batch carries its own temperature, top-p, top-k, min-p, penalties and random
generator, so requests with different settings decode together and a row's samples do not
depend on which other rows share its batch.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

GREEDY_EPS = 1e-6


class RequestError(Exception):
    """A request the engine rejects; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class SamplingParams:
    """SGLang's sampling parameters. temperature 0 means greedy; top_k -1 means all tokens."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def penalized(self) -> bool:
        return (
            self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.repetition_penalty != 1.0
        )


# Keys SGLang accepts that only matter to features this engine does not have: accepted when
# unset (the router and slime send them with their neutral values), rejected otherwise.
_UNSUPPORTED_KEYS = ("json_schema", "regex", "ebnf", "structural_tag", "stop_regex")
_IGNORED_KEYS = ("custom_params", "stream_interval")
_KNOWN_KEYS = tuple(f.name for f in fields(SamplingParams)) + _UNSUPPORTED_KEYS + _IGNORED_KEYS


def parse_sampling_params(raw: Mapping[str, Any] | None) -> SamplingParams:
    """Validate a request's `sampling_params` the way SGLang does; RequestError on bad input."""
    raw = dict(raw or {})
    unknown = sorted(k for k in raw if k not in _KNOWN_KEYS)
    if unknown:
        hint = difflib.get_close_matches(unknown[0], _KNOWN_KEYS, n=1)
        suffix = f" Did you mean '{hint[0]}'?" if hint else ""
        raise RequestError(f"unknown sampling parameter(s) {unknown}.{suffix}")
    for key in _UNSUPPORTED_KEYS:
        if raw.get(key) is not None:
            raise RequestError(f"sampling_params.{key} is not supported by the CPU engine")
    values = {k: v for k, v in raw.items() if v is not None and k not in _UNSUPPORTED_KEYS}
    for key in _IGNORED_KEYS:
        values.pop(key, None)
    if isinstance(values.get("stop"), str):
        values["stop"] = [values["stop"]]
    if isinstance(values.get("stop_token_ids"), int):
        values["stop_token_ids"] = [values["stop_token_ids"]]
    for key in ("stop", "stop_token_ids"):
        if key in values:
            values[key] = tuple(values[key])
    if "logit_bias" in values:
        values["logit_bias"] = _parse_logit_bias(values["logit_bias"])
    params = SamplingParams(**values)
    _check_ranges(params)
    return params


def _parse_logit_bias(raw: Any) -> tuple[tuple[int, float], ...]:
    if not isinstance(raw, Mapping):
        raise RequestError("sampling_params.logit_bias must map token ids to biases")
    try:
        return tuple((int(k), float(v)) for k, v in raw.items())
    except (TypeError, ValueError) as exc:
        raise RequestError(f"sampling_params.logit_bias is invalid: {exc}") from exc


def _check_ranges(p: SamplingParams) -> None:
    checks = [
        ("max_new_tokens", p.max_new_tokens, _is_int(p.max_new_tokens) and p.max_new_tokens >= 0),
        ("min_new_tokens", p.min_new_tokens, _is_int(p.min_new_tokens) and p.min_new_tokens >= 0),
        ("temperature", p.temperature, _is_num(p.temperature) and p.temperature >= 0),
        ("top_p", p.top_p, _is_num(p.top_p) and 0 < p.top_p <= 1),
        ("top_k", p.top_k, _is_int(p.top_k) and (p.top_k == -1 or p.top_k >= 1)),
        ("min_p", p.min_p, _is_num(p.min_p) and 0 <= p.min_p <= 1),
        ("repetition_penalty", p.repetition_penalty, _is_num(p.repetition_penalty)),
        ("n", p.n, _is_int(p.n) and p.n >= 1),
        ("sampling_seed", p.sampling_seed, p.sampling_seed is None or _is_int(p.sampling_seed)),
        ("stop", p.stop, all(isinstance(s, str) and s for s in p.stop)),
        ("stop_token_ids", p.stop_token_ids, all(_is_int(t) for t in p.stop_token_ids)),
    ]
    for key, value, ok in checks:
        if not ok:
            raise RequestError(f"sampling_params.{key} = {value!r} is out of range")
    if p.repetition_penalty <= 0:
        raise RequestError("sampling_params.repetition_penalty must be > 0")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class BatchSampler:
    """The per-row sampling settings of one batch as tensors; `select` follows row pruning."""

    def __init__(
        self, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
    ) -> None:
        self.params = list(params)
        self.generators = list(generators)
        temps = [1.0 if p.greedy else float(p.temperature) for p in params]
        self.temperature = torch.tensor(temps).unsqueeze(1)
        self.greedy = torch.tensor([p.greedy for p in params])
        self.top_p = torch.tensor([float(p.top_p) for p in params]).unsqueeze(1)
        self.top_k = torch.tensor([p.top_k for p in params])
        self.min_p = torch.tensor([float(p.min_p) for p in params]).unsqueeze(1)
        self.truncates = any(
            not p.greedy and (p.top_p < 1 or p.top_k > 0 or p.min_p > 0) for p in params
        )

    def select(self, keep: torch.Tensor) -> None:
        idx = keep.tolist()
        self.params = [self.params[i] for i in idx]
        self.generators = [self.generators[i] for i in idx]
        self.temperature = self.temperature[keep]
        self.greedy = self.greedy[keep]
        self.top_p = self.top_p[keep]
        self.top_k = self.top_k[keep]
        self.min_p = self.min_p[keep]

    def extend(self, other: BatchSampler) -> None:
        self.params = self.params + other.params
        self.generators = self.generators + other.generators
        self.temperature = torch.cat([self.temperature, other.temperature])
        self.greedy = torch.cat([self.greedy, other.greedy])
        self.top_p = torch.cat([self.top_p, other.top_p])
        self.top_k = torch.cat([self.top_k, other.top_k])
        self.min_p = torch.cat([self.min_p, other.min_p])
        self.truncates = self.truncates or other.truncates

    def sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pick one token per row; returns (tokens, logprob of each under logits / T).

        As in SGLang, the returned logprob comes from the temperature-scaled distribution
        before top-p/top-k/min-p truncation; greedy rows use the raw logits.
        """
        scaled = logits / self.temperature
        logprobs = torch.log_softmax(scaled, dim=-1)
        tokens = logits.argmax(dim=-1)
        sampled_rows = (~self.greedy).nonzero().flatten()
        if sampled_rows.numel():
            tokens[sampled_rows] = self._draw(logprobs[sampled_rows], sampled_rows)
        chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
        return tokens, chosen

    def _draw(self, logprobs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        probs = logprobs.exp()
        order: torch.Tensor | None = None
        if self.truncates:
            probs, order = self._truncate(probs, rows)
        cdf = probs.cumsum(dim=-1)
        # One uniform per row from that row's own generator: inverse-CDF sampling keeps a
        # row's draws independent of its batch neighbours.
        uniforms = torch.cat([torch.rand(1, generator=self.generators[i]) for i in rows.tolist()])
        uniforms = uniforms.unsqueeze(1) * cdf[:, -1:]
        picked = torch.searchsorted(cdf, uniforms, right=True).clamp(max=cdf.shape[1] - 1)
        nonzero_last = (probs > 0).cumsum(dim=-1).argmax(dim=-1, keepdim=True)
        picked = torch.minimum(picked, nonzero_last)
        if order is not None:
            picked = order.gather(1, picked)
        return picked.squeeze(1)

    def _truncate(
        self, probs: torch.Tensor, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        vocab = probs.shape[1]
        rank = torch.arange(vocab).unsqueeze(0)
        top_k = self.top_k[rows].clamp(min=0)
        top_k = torch.where(top_k == 0, vocab, top_k).unsqueeze(1)
        drop = rank >= top_k
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop |= mass_before > self.top_p[rows]
        drop |= sorted_probs < self.min_p[rows] * sorted_probs[:, :1]
        drop[:, 0] = False  # the most likely token always survives
        return sorted_probs.masked_fill(drop, 0.0), order


def apply_logit_adjustments(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[Sequence[int]],
    prompts: Sequence[Sequence[int]],
) -> None:
    """In place: logit_bias and the frequency/presence (output) and repetition penalties."""
    for row, (p, history) in enumerate(zip(params, histories, strict=True)):
        for token, bias in p.logit_bias:
            if 0 <= token < logits.shape[1]:
                logits[row, token] += bias
        if not p.penalized:
            continue
        vocab = logits.shape[1]
        if history and (p.frequency_penalty or p.presence_penalty):
            counts = torch.bincount(torch.tensor(history), minlength=vocab)[:vocab].float()
            logits[row] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        if p.repetition_penalty != 1.0:
            seen = torch.zeros(vocab, dtype=torch.bool)
            seen[[t for t in list(prompts[row]) + list(history) if t < vocab]] = True
            values = logits[row]
            scaled = torch.where(
                values > 0, values / p.repetition_penalty, values * p.repetition_penalty
            )
            logits[row] = torch.where(seen, scaled, values)
