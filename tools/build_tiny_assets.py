"""Build the offline assets behind rlpost's default CPU run.

Writes, under ``--out`` (normally ``rlpost/assets``):

- ``data/arith_train.jsonl`` and ``data/arith_eval.jsonl``: "What is a+b?" problems as chat
  message lists with a string ``label``, in the same layout as dapo-math-17k and aime-2024;
- ``qwen3-tiny/``: a byte-level BPE tokenizer (one token per digit, ChatML template) and a
  small Qwen3ForCausalLM given a short supervised warm start, so that GRPO starts with signal.

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

SEED = 1234
OPERAND_MAX = 30
EVAL_SIZE = 128
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

    def to_record(self) -> dict[str, object]:
        return {"prompt": [{"role": "user", "content": self.question}], "label": self.label}


@dataclass(frozen=True)
class WarmStartConfig:
    """Supervised warm start.

    Label smoothing keeps a fifth of each token's probability spread over the vocabulary, so
    greedy decoding is mostly right while samples at temperature 1 often are not: GRPO then
    has a clear, quickly learnable signal (sharpen what the model already knows).
    """

    steps: int = 500
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 20
    label_smoothing: float = 0.2


def split_problems(seed: int) -> tuple[list[Problem], list[Problem]]:
    """All (a, b) pairs in 0..OPERAND_MAX, shuffled, split into disjoint train and eval."""
    problems = [Problem(a, b) for a in range(OPERAND_MAX + 1) for b in range(OPERAND_MAX + 1)]
    random.Random(seed).shuffle(problems)
    return problems[EVAL_SIZE:], problems[:EVAL_SIZE]


def write_jsonl(path: Path, problems: list[Problem]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(p.to_record(), ensure_ascii=False) for p in problems]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def render_prompt(question: str) -> str:
    """What CHAT_TEMPLATE renders for one user turn plus the generation prompt."""
    return f"{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n"


def apply_template(tokenizer: PreTrainedTokenizerFast, problem: Problem) -> str:
    messages = problem.to_record()["prompt"]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


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
    wrapped = PreTrainedTokenizerFast(
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


def warm_start(
    model: Qwen3ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    problems: list[Problem],
    config: WarmStartConfig,
    seed: int,
) -> list[float]:
    """Supervised fine-tuning on the completion tokens; returns the loss per step."""
    input_ids, mask, labels = encode_examples(tokenizer, problems)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=0.0, betas=(0.9, 0.95)
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / config.warmup_steps)
    )
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    model.train()
    for _ in range(config.steps):
        index = torch.randint(len(problems), (config.batch_size,), generator=generator)
        logits = model(input_ids=input_ids[index], attention_mask=mask[index]).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1),
            labels[index][:, 1:].flatten(),
            ignore_index=-100,
            label_smoothing=config.label_smoothing,
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


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

    tokenizer = train_tokenizer(train)
    model = build_model(tokenizer, args.seed)
    config = WarmStartConfig(steps=args.warm_steps, lr=args.warm_lr)
    losses = warm_start(model, tokenizer, train, config, args.seed)
    save_model(model, tokenizer, args.out / MODEL_DIR)

    torch.manual_seed(args.seed)
    greedy = solve_rate(model, tokenizer, evaluation, do_sample=False)
    sampled = solve_rate(model, tokenizer, evaluation, do_sample=True)
    print(
        f"vocab {len(tokenizer)}, params {sum(p.numel() for p in model.parameters()):,}, "
        f"final loss {losses[-1]:.3f}, eval greedy {greedy:.3f}, eval T=1 {sampled:.3f}, "
        f"{time.perf_counter() - started_s:.1f} s on {threads} thread(s)"
    )


if __name__ == "__main__":
    main()
