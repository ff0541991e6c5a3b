"""SGLang's /generate request and response shapes, to and from the engine's rows."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlpost.backends.cpu_engine.sampling import (
    RequestError,
    SamplingParams,
    parse_sampling_params,
)

Encoder = Callable[[str], list[int]]
Decoder = Callable[[list[int], bool], str]

# Top-level keys that ask for features this engine does not have, with their neutral values.
# Anything else unknown (the router adds model, stream, log_metrics, ...) is ignored, as
# SGLang does.
_NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "stream": (None, False),
    "input_embeds": (None,),
    "image_data": (None, [], ""),
    "video_data": (None, [], ""),
    "audio_data": (None, [], ""),
    "lora_path": (None,),
    "top_logprobs_num": (None, 0),
    "token_ids_logprob": (None, []),
    "logprob_start_len": (None, -1),
    "return_hidden_states": (None, False),
    "return_routed_experts": (None, False),
    "session_params": (None,),
    "custom_logit_processor": (None,),
}


@dataclass(frozen=True)
class GenerateRequest:
    """One validated /generate call; `prompts` and `rids` are expanded for n samples."""

    prompts: list[list[int]]
    rids: list[str]
    params: SamplingParams
    return_logprob: bool
    return_text_in_logprobs: bool
    returns_list: bool


def parse_generate_request(body: Any, encode: Encoder, context_len: int | None) -> GenerateRequest:
    """Validate a /generate body; raises RequestError (HTTP 400) naming the bad field."""
    if not isinstance(body, Mapping):
        raise RequestError("the /generate body must be a JSON object")
    for key, neutral in _NEUTRAL_VALUES.items():
        if key in body and body[key] not in neutral:
            raise RequestError(f"'{key}' = {body[key]!r} is not supported by the CPU engine")
    prompts, is_batch = _read_prompts(body, encode)
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, Mapping):
        raise RequestError("sampling_params must be a JSON object")
    params = parse_sampling_params(sampling)
    if context_len is not None:
        for prompt in prompts:
            _check_context(len(prompt), params.max_new_tokens, context_len)
    expanded = [p for p in prompts for _ in range(params.n)]
    rids = _expand_rids(body.get("rid"), len(prompts), params.n)
    return GenerateRequest(
        prompts=expanded,
        rids=rids,
        params=params,
        return_logprob=bool(body.get("return_logprob") or False),
        return_text_in_logprobs=bool(body.get("return_text_in_logprobs") or False),
        returns_list=is_batch or params.n > 1,
    )


def _read_prompts(body: Mapping[str, Any], encode: Encoder) -> tuple[list[list[int]], bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise RequestError("give exactly one of 'text' or 'input_ids'")
    if text is not None:
        if isinstance(text, str):
            return [encode(text)], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [encode(t) for t in text], True
        raise RequestError("'text' must be a string or a non-empty list of strings")
    if isinstance(input_ids, list) and input_ids and all(_is_id(t) for t in input_ids):
        return [list(input_ids)], False
    if (
        isinstance(input_ids, list)
        and input_ids
        and all(isinstance(p, list) and p and all(_is_id(t) for t in p) for p in input_ids)
    ):
        return [list(p) for p in input_ids], True
    raise RequestError("'input_ids' must be a non-empty list of token ids or of such lists")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_context(prompt_len: int, max_new_tokens: int, context_len: int) -> None:
    if prompt_len >= context_len:
        raise RequestError(
            f"the input ({prompt_len} tokens) is longer than the model's context length "
            f"({context_len} tokens)"
        )
    if prompt_len + max_new_tokens > context_len:
        raise RequestError(
            f"requested token count exceeds the model's maximum context length of "
            f"{context_len} tokens: {prompt_len} input + {max_new_tokens} max_new_tokens; "
            f"lower max_new_tokens"
        )


def _expand_rids(rid: Any, num_prompts: int, n: int) -> list[str]:
    total = num_prompts * n
    if rid is None:
        return [uuid.uuid4().hex for _ in range(total)]
    if isinstance(rid, str):
        return [rid] if total == 1 else [f"{rid}_{i}" for i in range(total)]
    if isinstance(rid, list) and len(rid) == num_prompts and all(isinstance(r, str) for r in rid):
        return [r if n == 1 else f"{r}_{j}" for r in rid for j in range(n)]
    raise RequestError(f"'rid' must be a string or a list of {num_prompts} strings")


@dataclass(frozen=True)
class RowOutput:
    """What the response needs of a finished row."""

    rid: str
    prompt_len: int
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: dict[str, Any]
    weight_version: str


def render_output(out: RowOutput, request: GenerateRequest, decode: Decoder) -> dict[str, Any]:
    """One SGLang /generate result. output_ids keep a matched stop token; the text drops it
    (and a matched stop string) unless no_stop_trim is set, as SGLang does."""
    params = request.params
    meta: dict[str, Any] = {
        "id": out.rid,
        "finish_reason": out.finish_reason,
        "prompt_tokens": out.prompt_len,
        "completion_tokens": len(out.output_ids),
        "cached_tokens": 0,
        "weight_version": out.weight_version,
    }
    if request.return_logprob:
        with_text = request.return_text_in_logprobs
        meta["output_token_logprobs"] = [
            [lp, tok, decode([tok], False) if with_text else None]
            for lp, tok in zip(out.logprobs, out.output_ids, strict=True)
        ]
        meta["output_token_logprobs_length"] = len(out.output_ids)
    return {
        "text": _render_text(out, params, decode),
        "output_ids": list(out.output_ids),
        "meta_info": meta,
    }


def _render_text(out: RowOutput, params: SamplingParams, decode: Decoder) -> str:
    matched = out.finish_reason.get("matched")
    ids = out.output_ids
    if params.no_stop_trim or matched is None:
        return decode(ids, params.skip_special_tokens)
    if isinstance(matched, int):
        return decode(ids[:-1], params.skip_special_tokens)
    text = decode(ids, params.skip_special_tokens)
    cut = text.find(matched)
    return text[:cut] if cut >= 0 else text
