"""The shipped tiny model, tokenizer and arithmetic data load offline and behave as documented."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

REPO_ROOT = Path(__file__).resolve().parents[3]
ASSETS = REPO_ROOT / "rlpost" / "assets"
MODEL_DIR = ASSETS / "qwen3-tiny"
TRAIN_PATH = ASSETS / "data" / "arith_train.jsonl"
EVAL_PATH = ASSETS / "data" / "arith_eval.jsonl"
CALC_TRAIN_PATH = ASSETS / "data" / "calc_train.jsonl"
CALC_EVAL_PATH = ASSETS / "data" / "calc_eval.jsonl"
BUILDER_PATH = REPO_ROOT / "tools" / "build_tiny_assets.py"

# The shipped model greedily solves 23 of the first 32 eval problems (0.72) and 77% of all 128.
MIN_GREEDY_SOLVE_RATE = 0.5
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def read_jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module", autouse=True)
def offline_hub() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        yield


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(MODEL_DIR, local_files_only=True)


@pytest.fixture(scope="module")
def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_tiny_assets", BUILDER_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_chat_template_renders_chatml_with_generation_prompt(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    messages = [{"role": "user", "content": "What is 3+4?"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n"
    no_think = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think == rendered + "<think>\n\n</think>\n\n"
    closed = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert closed == "<|im_start|>user\nWhat is 3+4?<|im_end|>\n"


def test_special_tokens_are_single_ids(tokenizer: PreTrainedTokenizerBase) -> None:
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    for token in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert len(tokenizer) < 512


def test_digits_tokenize_one_per_token(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("\\boxed{1234567890}", add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert [p for p in pieces if p.isdigit()] == list("1234567890")
    assert tokenizer.decode(ids) == "\\boxed{1234567890}"


def test_data_files_have_prompt_messages_and_string_labels() -> None:
    for path in (TRAIN_PATH, EVAL_PATH, CALC_TRAIN_PATH, CALC_EVAL_PATH):
        for record in read_jsonl(path):
            assert set(record) == {"prompt", "label"}, path
            prompt = record["prompt"]
            assert isinstance(prompt, list) and len(prompt) == 1
            assert prompt[0]["role"] == "user" and prompt[0]["content"].startswith("What is ")
            assert isinstance(record["label"], str) and record["label"].isdigit()


def test_labels_are_the_sums_and_eval_is_disjoint_from_train() -> None:
    train, evaluation = read_jsonl(TRAIN_PATH), read_jsonl(EVAL_PATH)
    for record in train + evaluation:
        a, b = re.fullmatch(r"What is (\d+)\+(\d+)\?", record["prompt"][0]["content"]).groups()
        assert int(record["label"]) == int(a) + int(b)
    questions = {r["prompt"][0]["content"] for r in train}
    eval_questions = {r["prompt"][0]["content"] for r in evaluation}
    assert len(questions) == len(train) and len(eval_questions) == len(evaluation)
    assert not questions & eval_questions
    assert 64 <= len(evaluation) <= 128


def test_prompts_stay_short_with_the_template(tokenizer: PreTrainedTokenizerBase) -> None:
    longest = max(
        len(tokenizer.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True))
        for r in read_jsonl(TRAIN_PATH)
    )
    assert longest < 40


def test_builder_reproduces_shipped_data_and_tokenizer(builder: ModuleType, tmp_path: Path) -> None:
    train, evaluation = builder.split_problems(builder.SEED)
    builder.write_jsonl(tmp_path / "train.jsonl", train)
    builder.write_jsonl(tmp_path / "eval.jsonl", evaluation)
    assert (tmp_path / "train.jsonl").read_bytes() == TRAIN_PATH.read_bytes()
    assert (tmp_path / "eval.jsonl").read_bytes() == EVAL_PATH.read_bytes()
    calc_train, calc_eval = builder.split_calc_problems(builder.SEED)
    builder.write_jsonl(tmp_path / "calc_train.jsonl", calc_train)
    builder.write_jsonl(tmp_path / "calc_eval.jsonl", calc_eval)
    assert (tmp_path / "calc_train.jsonl").read_bytes() == CALC_TRAIN_PATH.read_bytes()
    assert (tmp_path / "calc_eval.jsonl").read_bytes() == CALC_EVAL_PATH.read_bytes()
    builder.train_tokenizer(train).save_pretrained(tmp_path / "tok")
    rebuilt = json.loads((tmp_path / "tok" / "tokenizer.json").read_text(encoding="utf-8"))
    shipped = json.loads((MODEL_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    assert rebuilt == shipped


def test_model_greedily_solves_eval_problems(tokenizer: PreTrainedTokenizerBase) -> None:
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, local_files_only=True).eval()
    assert model.config.model_type == "qwen3"
    assert model.config.tie_word_embeddings
    records = read_jsonl(EVAL_PATH)[:32]
    prompts = [
        tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
        for r in records
    ]
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=False,
            max_new_tokens=16,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    completions = tokenizer.batch_decode(
        out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
    )
    answers = [m.group(1) if (m := BOXED.search(c)) else None for c in completions]
    solved = sum(a == r["label"] for a, r in zip(answers, records, strict=True)) / len(records)
    assert solved >= MIN_GREEDY_SOLVE_RATE, (solved, completions[:4])


def test_calculator_labels_are_two_digit_products_and_eval_is_disjoint() -> None:
    train, evaluation = read_jsonl(CALC_TRAIN_PATH), read_jsonl(CALC_EVAL_PATH)
    for record in train + evaluation:
        a, b = re.fullmatch(r"What is (\d\d)\*(\d\d)\?", record["prompt"][0]["content"]).groups()
        assert int(record["label"]) == int(a) * int(b)
    assert not {r["prompt"][0]["content"] for r in train} & {
        r["prompt"][0]["content"] for r in evaluation
    }
    assert len(train) + len(evaluation) == 90 * 90


def test_a_calculator_transcript_renders_as_the_runtime_renders_its_turns(
    builder: ModuleType, tokenizer: PreTrainedTokenizerBase
) -> None:
    """The warm start trains on the call and the answer, never on the tool's turn, and the
    tool's turn is the text the runtime inserts (rlpost.runtime.rollout.context)."""
    segments = builder.calc_segments(tokenizer, builder.CalcProblem(23, 47))
    texts = [(tokenizer.decode(ids), trained) for ids, trained in segments]
    assert texts[1:] == [
        ("<calc>23*47</calc><|im_end|>", True),
        ("\n<|im_start|>tool\n1081<|im_end|>\n<|im_start|>assistant\n", False),
        ("\\boxed{1081}<|im_end|>", True),
    ]


def test_model_calls_the_calculator_and_states_its_answer(
    builder: ModuleType, tokenizer: PreTrainedTokenizerBase
) -> None:
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, local_files_only=True).eval()
    problems = [builder.CalcProblem(a, b) for a, b in ((23, 47), (91, 18), (55, 66), (12, 89))]
    assert builder.calc_solve_rate(model, tokenizer, problems, do_sample=False) == 1.0
