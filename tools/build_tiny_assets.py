"""Build the offline assets behind rlpost's default CPU run.

Writes, under ``--out`` (normally ``rlpost/assets``):

- ``data/arith_train.jsonl`` and ``data/arith_eval.jsonl``: "What is a+b?" problems as chat
  message lists with a string ``label``, in the same layout as dapo-math-17k and aime-2024;
- ``data/calc_train.jsonl`` and ``data/calc_eval.jsonl``: "What is a*b?" with two-digit
  operands, which the tiny model cannot multiply in its head: it answers by calling the
  calculator of rlpost.envs.calculator (recipe grpo_tiny_calculator);
- ``qwen3-tiny/``: a byte-level BPE tokenizer (one token per digit, ChatML template) and a
  small Qwen3ForCausalLM given a short supervised warm start on both tasks (a sum answered
  directly; a product answered with a call, the tool's turn, then the result), so that GRPO
  starts with signal.

Everything is seeded and deterministic: rerunning gives identical files with the same library
versions, whatever ``--threads`` is (the thread count changes speed, not results).

    python tools/build_tiny_assets.py --out rlpost/assets
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from rlpost.envs.calculator import calculate, find_call, format_call
from rlpost.runtime.rollout.context import render_environment_turn

SEED = 1234
OPERAND_MAX = 30
EVAL_SIZE = 128
CALC_OPERANDS = range(10, 100)
BPE_VOCAB_SIZE = 320
MODEL_DIR = "qwen3-tiny"
DATA_DIR = "data"

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, "<think>", "</think>"]

# Qwen3-style ChatML. With enable_thinking=false the generation prompt carries an empty think
# block, as Qwen3 does; by default the model answers directly after the assistant header.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

BOXED_PATTERN = re.compile(r"\\boxed\{([^{}]*)\}")


@dataclass(frozen=True)
class Problem:
    """One arithmetic question and its answer."""

    a: int
    b: int

    @property
    def question(self) -> str:
        return f"What is {self.a}+{self.b}?"

    @property
    def label(self) -> str:
        return str(self.a + self.b)

    def prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.question}]

    def to_record(self) -> dict[str, object]:
        return {"prompt": self.prompt(), "label": self.label}


@dataclass(frozen=True)
class CalcProblem:
    """A product of two two-digit numbers, answered through the calculator tool."""

    a: int
    b: int

    @property
    def question(self) -> str:
        return f"What is {self.a}*{self.b}?"

    @property
    def label(self) -> str:
        return str(self.a * self.b)

    @property
    def call(self) -> str:
        return format_call(f"{self.a}*{self.b}")

    def to_record(self) -> dict[str, object]:
        return {"prompt": [{"role": "user", "content": self.question}], "label": self.label}

    def conversation(self) -> list[dict[str, str]]:
        """The whole exchange the warm start teaches: call, tool answer, result."""
        return [
            {"role": "user", "content": self.question},
            {"role": "assistant", "content": self.call},
            {"role": "tool", "content": calculate(f"{self.a}*{self.b}")},
            {"role": "assistant", "content": f"\\boxed{{{self.label}}}"},
        ]


@dataclass(frozen=True)
class WarmStartConfig:
    """Supervised warm start.

    Label smoothing keeps a fifth of each token's probability spread over the vocabulary, so
    greedy decoding is mostly right while samples at temperature 1 often are not: GRPO then
    has a clear, quickly learnable signal (sharpen what the model already knows).
    """

    steps: int = 1000
    batch_size: int = 32
    calc_fraction: float = 0.5  # of each batch: calculator transcripts
    # A calculator transcript trains about 28 tokens, a sum about 6: the same smoothing per
    # token would leave almost no transcript right at temperature 1 (0.8^28), so it gets less.
    calc_label_smoothing: float = 0.05
    lr: float = 1e-3
    warmup_steps: int = 20
    label_smoothing: float = 0.2


def split_problems(seed: int) -> tuple[list[Problem], list[Problem]]:
    """All (a, b) pairs in 0..OPERAND_MAX, shuffled, split into disjoint train and eval."""
    problems = [Problem(a, b) for a in range(OPERAND_MAX + 1) for b in range(OPERAND_MAX + 1)]
    random.Random(seed).shuffle(problems)
    return problems[EVAL_SIZE:], problems[:EVAL_SIZE]


def split_calc_problems(seed: int) -> tuple[list[CalcProblem], list[CalcProblem]]:
    """All two-digit products, shuffled, split into disjoint train and eval."""
    problems = [CalcProblem(a, b) for a in CALC_OPERANDS for b in CALC_OPERANDS]
    random.Random(seed + 1).shuffle(problems)
    return problems[EVAL_SIZE:], problems[:EVAL_SIZE]


def write_jsonl(path: Path, problems: list[Problem] | list[CalcProblem]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(p.to_record(), ensure_ascii=False) for p in problems]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def render_prompt(question: str) -> str:
    """What CHAT_TEMPLATE renders for one user turn plus the generation prompt."""
    return f"{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n"


def apply_template(tokenizer: PreTrainedTokenizerFast, problem: Problem) -> str:
    return apply_template_messages(tokenizer, problem.prompt())


def render_completion(label: str) -> str:
    return f"\\boxed{{{label}}}{IM_END}"


def train_tokenizer(problems: list[Problem]) -> PreTrainedTokenizerFast:
    """Byte-level BPE over the rendered conversations; digits are always single tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [render_prompt(p.question) + render_completion(p.label) for p in problems]
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # transformers leaves its __init__ (TokenizersBackend's) unannotated
    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, "<think>", "</think>"],
        model_max_length=512,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen3ForCausalLM:
    """A ~3M-parameter Qwen3 with the shapes of its larger siblings, scaled down."""
    vocab_size = 64 * -(-len(tokenizer) // 64)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def encode_examples(
    tokenizer: PreTrainedTokenizerFast, problems: list[Problem]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels masked to the completion."""
    rows: list[tuple[list[int], list[int]]] = []
    for p in problems:
        prompt_ids = tokenizer.encode(apply_template(tokenizer, p), add_special_tokens=False)
        completion_ids = tokenizer.encode(render_completion(p.label), add_special_tokens=False)
        rows.append((prompt_ids, completion_ids))
    width = max(len(p) + len(c) for p, c in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (prompt_ids, completion_ids) in enumerate(rows):
        ids = prompt_ids + completion_ids
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, len(prompt_ids) : len(ids)] = torch.tensor(completion_ids)
        mask[i, : len(ids)] = 1
    return input_ids, mask, labels


def calc_segments(
    tokenizer: PreTrainedTokenizerFast, problem: CalcProblem
) -> list[tuple[list[int], bool]]:
    """A calculator transcript as (token ids, trained) segments: the prompt, the call, the
    tool's turn (rendered as the runtime renders it), the result. Checked against the chat
    template's rendering of the whole conversation."""
    conversation = problem.conversation()
    prompt = apply_template_messages(tokenizer, conversation[:1])
    call = problem.call + IM_END
    tool = render_environment_turn(tokenizer, call, conversation[2]["content"], "tool")
    answer = conversation[3]["content"] + IM_END
    whole = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert whole == prompt + call + tool + answer + "\n", whole
    encode = tokenizer.encode
    return [
        (encode(prompt, add_special_tokens=False), False),
        (encode(call, add_special_tokens=False), True),
        (encode(tool, add_special_tokens=False), False),
        (encode(answer, add_special_tokens=False), True),
    ]


def apply_template_messages(
    tokenizer: PreTrainedTokenizerFast, messages: list[dict[str, str]]
) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str)  # tokenize=False: the rendered text
    return text


def encode_calc_examples(
    tokenizer: PreTrainedTokenizerFast, problems: list[CalcProblem]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Like encode_examples, labels on the model's two turns only (never the tool's)."""
    rows = [calc_segments(tokenizer, p) for p in problems]
    width = max(sum(len(ids) for ids, _ in row) for row in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        at = 0
        for ids, trained in row:
            input_ids[i, at : at + len(ids)] = torch.tensor(ids)
            if trained:
                labels[i, at : at + len(ids)] = torch.tensor(ids)
            at += len(ids)
        mask[i, :at] = 1
    return input_ids, mask, labels


def _pad_to(tensor: torch.Tensor, width: int, value: int) -> torch.Tensor:
    return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=value)


def warm_start(
    model: Qwen3ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    problems: list[Problem],
    config: WarmStartConfig,
    seed: int,
    calc_problems: list[CalcProblem] | None = None,
) -> list[float]:
    """Supervised fine-tuning on the completion tokens; returns the loss per step. With
    `calc_problems`, `config.calc_fraction` of every batch is calculator transcripts."""
    input_ids, mask, labels = encode_examples(tokenizer, problems)
    num_calc = round(config.batch_size * config.calc_fraction) if calc_problems else 0
    if num_calc:
        calc_ids, calc_mask, calc_labels = encode_calc_examples(tokenizer, calc_problems or [])
        width = max(input_ids.shape[1], calc_ids.shape[1])
        pad = tokenizer.pad_token_id
        input_ids = torch.cat([_pad_to(input_ids, width, pad), _pad_to(calc_ids, width, pad)])
        mask = torch.cat([_pad_to(mask, width, 0), _pad_to(calc_mask, width, 0)])
        labels = torch.cat([_pad_to(labels, width, -100), _pad_to(calc_labels, width, -100)])
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=0.0, betas=(0.9, 0.95)
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / config.warmup_steps)
    )
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    model.train()
    smoothing = torch.full((len(input_ids), 1), config.label_smoothing)
    smoothing[len(problems) :] = config.calc_label_smoothing
    for _ in range(config.steps):
        index = torch.randint(len(problems), (config.batch_size - num_calc,), generator=generator)
        if num_calc:
            calc = torch.randint(len(calc_problems or []), (num_calc,), generator=generator)
            index = torch.cat([index, calc + len(problems)])
        logits = model(input_ids=input_ids[index], attention_mask=mask[index]).logits
        loss = smoothed_loss(logits[:, :-1], labels[index][:, 1:], smoothing[index])
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.train(False)
    return losses


def smoothed_loss(
    logits: torch.Tensor, labels: torch.Tensor, smoothing: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy with label smoothing per row (as F.cross_entropy's label_smoothing: a
    row's `smoothing` share of each target spread evenly over the vocabulary), averaged over
    the labelled tokens."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    kept = labels != -100
    nll = -log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    uniform = -log_probs.mean(-1)
    per_token = (1 - smoothing) * nll + smoothing * uniform
    return per_token[kept].mean()


def extract_boxed(text: str) -> str | None:
    match = BOXED_PATTERN.search(text)
    return match.group(1).strip() if match else None


@torch.no_grad()
def solve_rate(
    model: Qwen3ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    problems: list[Problem],
    do_sample: bool,
    max_new_tokens: int = 16,
) -> float:
    """Fraction of problems whose completion boxes exactly the right answer."""
    prompts = [apply_template(tokenizer, p) for p in problems]
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    tokenizer.padding_side = "right"
    # Sampling draws from the whole vocabulary, as the rollout engines do (top_k -1).
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    out = model.generate(
        **batch,
        **(sampling if do_sample else {"do_sample": False}),
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    correct = [extract_boxed(t) == p.label for t, p in zip(texts, problems, strict=True)]
    return sum(correct) / len(problems)


@torch.no_grad()
def _continue(
    model: Qwen3ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    texts: list[str],
    do_sample: bool,
    max_new_tokens: int,
) -> list[str]:
    """One batched turn: each text continued until the end of the turn (left padding)."""
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    tokenizer.padding_side = "right"
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    out = model.generate(
        **batch,
        **(sampling if do_sample else {"do_sample": False}),
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    new = out[:, batch["input_ids"].shape[1] :]
    turns: list[str] = []
    for row in new.tolist():
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id) + 1]
        text = tokenizer.decode([t for t in row if t != tokenizer.pad_token_id])
        assert isinstance(text, str)  # one sequence's ids: one text
        turns.append(text)
    return turns


def calc_solve_rate(
    model: Qwen3ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    problems: list[CalcProblem],
    do_sample: bool,
) -> float:
    """Fraction of products answered right through the tool: a call turn, the calculator's
    turn (rlpost.envs.calculator), the answer turn, as recipe grpo_tiny_calculator runs."""
    prompts = [apply_template_messages(tokenizer, p.conversation()[:1]) for p in problems]
    calls = _continue(model, tokenizer, prompts, do_sample, max_new_tokens=24)
    followed = []
    for prompt, call in zip(prompts, calls, strict=True):
        expression = find_call(call)
        answer = calculate(expression) if expression is not None else "error: no call"
        followed.append(prompt + call + render_environment_turn(tokenizer, call, answer, "tool"))
    answers = _continue(model, tokenizer, followed, do_sample, max_new_tokens=16)
    correct = [extract_boxed(t) == p.label for t, p in zip(answers, problems, strict=True)]
    return sum(correct) / len(problems)


def save_model(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def default_threads() -> int:
    """Two threads on an idle machine; one when other processes already load the cores.

    Two torch threads sharing busy cores spin-wait on each other and ran four times slower
    than one thread here.
    """
    cores = os.cpu_count() or 1
    idle_cores = cores - os.getloadavg()[0]
    return 2 if cores >= 2 and idle_cores >= 1.5 else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="assets folder, e.g. rlpost/assets")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--warm-steps", type=int, default=WarmStartConfig.steps)
    parser.add_argument("--warm-lr", type=float, default=WarmStartConfig.lr)
    parser.add_argument("--calc-fraction", type=float, default=WarmStartConfig.calc_fraction)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: 2, or 1 if busy)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    threads = args.threads or default_threads()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    started_s = time.perf_counter()

    train, evaluation = split_problems(args.seed)
    write_jsonl(args.out / DATA_DIR / "arith_train.jsonl", train)
    write_jsonl(args.out / DATA_DIR / "arith_eval.jsonl", evaluation)
    calc_train, calc_eval = split_calc_problems(args.seed)
    write_jsonl(args.out / DATA_DIR / "calc_train.jsonl", calc_train)
    write_jsonl(args.out / DATA_DIR / "calc_eval.jsonl", calc_eval)

    tokenizer = train_tokenizer(train)
    model = build_model(tokenizer, args.seed)
    config = WarmStartConfig(
        steps=args.warm_steps, lr=args.warm_lr, calc_fraction=args.calc_fraction
    )
    losses = warm_start(model, tokenizer, train, config, args.seed, calc_train)
    save_model(model, tokenizer, args.out / MODEL_DIR)

    torch.manual_seed(args.seed)
    greedy = solve_rate(model, tokenizer, evaluation, do_sample=False)
    sampled = solve_rate(model, tokenizer, evaluation, do_sample=True)
    calc_greedy = calc_solve_rate(model, tokenizer, calc_eval, do_sample=False)
    calc_sampled = calc_solve_rate(model, tokenizer, calc_eval, do_sample=True)
    print(
        f"vocab {len(tokenizer)}, params {sum(p.numel() for p in model.parameters()):,}, "
        f"final loss {losses[-1]:.3f}, eval greedy {greedy:.3f}, eval T=1 {sampled:.3f}, "
        f"calculator greedy {calc_greedy:.3f}, calculator T=1 {calc_sampled:.3f}, "
        f"{time.perf_counter() - started_s:.1f} s on {threads} thread(s)"
    )


if __name__ == "__main__":
    main()
