"""Sampling parameters are validated like SGLang's, and each row's truncation is honoured."""

from __future__ import annotations

import pytest
import torch

from rlpost.backends.cpu_engine.sampling import (
    BatchSampler,
    RequestError,
    SamplingParams,
    apply_logit_adjustments,
    parse_sampling_params,
)


def test_defaults_follow_sglang() -> None:
    params = parse_sampling_params({})
    assert params == SamplingParams()
    assert (params.max_new_tokens, params.temperature, params.top_k) == (128, 1.0, -1)
    assert params.skip_special_tokens and not params.no_stop_trim


def test_unknown_key_is_rejected_with_a_suggestion() -> None:
    with pytest.raises(RequestError, match=r"max_new_token.*Did you mean 'max_new_tokens'"):
        parse_sampling_params({"max_new_token": 3})


@pytest.mark.parametrize(
    "raw",
    [
        {"max_new_tokens": -1},
        {"max_new_tokens": 2.5},
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_k": 0},
        {"n": 0},
        {"stop_token_ids": ["a"]},
        {"regex": "[0-9]+"},
    ],
)
def test_bad_values_are_rejected(raw: dict[str, object]) -> None:
    with pytest.raises(RequestError) as info:
        parse_sampling_params(raw)
    assert info.value.status == 400
    assert next(iter(raw)) in info.value.message


def test_router_neutral_values_and_scalars_are_accepted() -> None:
    params = parse_sampling_params(
        {"stop": "x", "stop_token_ids": 5, "custom_params": None, "json_schema": None, "n": None}
    )
    assert params.stop == ("x",) and params.stop_token_ids == (5,) and params.n == 1


def draw(params: SamplingParams, logits: torch.Tensor, times: int) -> set[int]:
    rows = logits.expand(times, -1).clone()
    generators = [torch.Generator().manual_seed(i) for i in range(times)]
    sampler = BatchSampler([params] * times, generators)
    tokens, _ = sampler.sample(rows)
    return set(tokens.tolist())


LOGITS = torch.tensor([[2.0, 1.9, 1.8, 1.7, -1.0, -1.0]])


def test_top_k_top_p_and_min_p_truncate_per_row() -> None:
    assert draw(SamplingParams(temperature=1.0), LOGITS, 300) == set(range(6))
    assert draw(SamplingParams(temperature=1.0, top_k=2), LOGITS, 300) == {0, 1}
    assert draw(SamplingParams(temperature=1.0, top_p=0.5), LOGITS, 300) == {0, 1}
    assert draw(SamplingParams(temperature=1.0, min_p=0.5), LOGITS, 300) == {0, 1, 2, 3}
    assert draw(SamplingParams(temperature=1.0, top_p=1e-6), LOGITS, 50) == {0}


def test_mixed_rows_keep_their_own_settings_and_logprobs() -> None:
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=2.0, top_k=1)]
    logits = LOGITS.expand(2, -1).clone()
    sampler = BatchSampler(params, [torch.Generator(), torch.Generator()])
    tokens, logprobs = sampler.sample(logits)
    assert tokens.tolist() == [0, 0]
    expected = [torch.log_softmax(LOGITS[0], -1)[0], torch.log_softmax(LOGITS[0] / 2.0, -1)[0]]
    torch.testing.assert_close(logprobs, torch.stack(expected))


def test_penalties_and_logit_bias_adjust_only_their_tokens() -> None:
    logits = torch.tensor([[1.0, 2.0, -1.0, 0.5], [1.0, 2.0, -1.0, 0.5]])
    params = [
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.25, logit_bias=((3, 2.0),)),
        SamplingParams(repetition_penalty=2.0),
    ]
    apply_logit_adjustments(logits, params, [[1, 1, 2], [2]], [[0], [1]])
    assert logits[0].tolist() == [1.0, 2.0 - 1.0 - 0.25, -1.0 - 0.5 - 0.25, 2.5]
    assert logits[1].tolist() == [1.0, 1.0, -2.0, 0.5]  # prompt token 1 and output token 2


def test_a_rollout_request_states_every_parameter_that_shapes_the_distribution() -> None:
    """What an SGLang engine would otherwise take from the checkpoint's generation_config.json
    (min_p, a repetition penalty) is stated at its neutral value, and the engines read it so."""
    from rlpost.runtime.rollout.manager import NEUTRAL_SAMPLING, SamplingSettings

    raw = SamplingSettings(max_new_tokens=16, temperature=0.7).to_sglang()
    assert {k: raw[k] for k in NEUTRAL_SAMPLING} == NEUTRAL_SAMPLING
    assert (raw["temperature"], raw["top_p"], raw["top_k"]) == (0.7, 1.0, -1)
    params = parse_sampling_params(raw)
    assert not params.penalized and params.min_p == 0.0 and not params.greedy
