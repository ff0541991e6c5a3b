"""A tokenizer's added tokens against the model's embedding rows (preflight)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from rlpost.config.chat_templates import added_token_ids
from rlpost.preflight.tokens import check_tokens_in_embedding
from rlpost.schema import ModelConfig


def _tokenizer_config(folder: Path, decoder: dict[str, object]) -> Path:
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    return folder


def test_tokenizer_config_added_tokens_count_too(tmp_path: Path) -> None:
    folder = _tokenizer_config(
        tmp_path / "ckpt",
        {"2": {"content": "<|im_end|>", "special": True}, "320": {"content": "<tool>"}},
    )
    assert added_token_ids(folder) == {2: "<|im_end|>", 320: "<tool>"}


def test_only_tokens_past_the_vocabulary_are_refused(
    tmp_path: Path, model_config: Callable[[str], ModelConfig]
) -> None:
    model = model_config("qwen3-tiny")  # 320 embedding rows
    inside = _tokenizer_config(tmp_path / "inside", {"319": {"content": "<last>"}})
    assert check_tokens_in_embedding(model.model_copy(update={"hf_checkpoint": str(inside)})) == []
    past = _tokenizer_config(tmp_path / "past", {"320": {"content": "<tool>"}})
    issues = check_tokens_in_embedding(model.model_copy(update={"hf_checkpoint": str(past)}))
    assert [i.key for i in issues] == ["model.hf_checkpoint"]
    assert "'<tool>' = 320" in issues[0].message and "resize" in issues[0].fix
