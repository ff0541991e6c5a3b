"""A tiny byte-level BPE tokenizer with a ChatML chat template, the shipped tiny tokenizer
with a template that renders tools, and jsonl writers."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

TINY_TOKENIZER = Path(__file__).resolve().parents[3] / "rlpost" / "assets" / "qwen3-tiny"
CHATML_WITH_TOOLS = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for tool in tools %}{{ tool | tojson }}\n"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


@pytest.fixture(scope="session")
def chat_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [f"Problem {i}: what is {i} times {i + 1}? user assistant" for i in range(200)]
    backend.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML,
    )


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    """The shipped tiny model's tokenizer, whose ChatML template never reads `tools`."""
    return AutoTokenizer.from_pretrained(TINY_TOKENIZER, local_files_only=True)


@pytest.fixture(scope="session")
def tools_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The shipped tiny tokenizer with a ChatML template that lists the tools, as JSON, in a
    '# Tools' system turn (as Qwen's templates do)."""
    folder = tmp_path_factory.mktemp("tools-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_TOKENIZER / name, folder / name)
    (folder / "chat_template.jinja").write_text(CHATML_WITH_TOOLS, encoding="utf-8")
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


@pytest.fixture
def write_jsonl(tmp_path: Path) -> Callable[..., Path]:
    def write(rows: list[Any], name: str = "prompts.jsonl") -> Path:
        path = tmp_path / name
        lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    return write


HOOKS_DIR = Path(__file__).resolve().parents[2] / "hooks_fixtures"


@pytest.fixture
def hook_modules(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Makes tests/hooks_fixtures importable by dotted path."""
    monkeypatch.syspath_prepend(str(HOOKS_DIR))
    return HOOKS_DIR
