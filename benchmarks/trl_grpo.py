"""TRL's GRPOTrainer on the CPU default's model, data and batch, for benchmarks/cpu_loop.py.

    .venv/bin/python benchmarks/trl_grpo.py --steps 40 --out trl.json

Needs the `bench` extra (`pip install -c constraints.txt -e ".[bench]"`). The same shipped
qwen3-tiny, the same arithmetic prompts (chat template applied), 8 prompts x 8 samples per
step, 16 new tokens, temperature 1.0, lr 1e-4, clip 0.2 / 0.28, no KL (TRL's beta 0: no
reference model either), fp32 without recompute, the same math grader as rlpost's
`reward.type: math`. Writes the end-to-end seconds, the seconds and samples of the steps
after warm-up, and the mean reward per step as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

STARTED = time.time()
ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "rlpost" / "assets"
PROMPTS, GENERATIONS, NEW_TOKENS = 8, 8, 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    import torch
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        TrainerCallback,
        TrainerControl,
        TrainerState,
        TrainingArguments,
    )
    from trl import GRPOConfig, GRPOTrainer

    from rlpost.rewards.answers import grade_math

    torch.manual_seed(1234)
    rows = [json.loads(line) for line in (ASSETS / "data" / "arith_train.jsonl").open()]
    data = Dataset.from_list([{"prompt": r["prompt"], "label": r["label"]} for r in rows])

    def math_reward(completions: list[Any], label: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [grade_math(text, gold) for text, gold in zip(texts, label, strict=True)]

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[float] = []
            self.rewards: list[float] = []
            self._start = 0.0

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self._start = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.steps.append(time.perf_counter() - self._start)

        def on_log(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            logs: dict[str, float] | None = None,
            **__: Any,
        ) -> None:
            if logs and "reward" in logs:
                self.rewards.append(float(logs["reward"]))

    model_dir = str(ASSETS / "qwen3-tiny")
    config = GRPOConfig(
        output_dir=str(args.out.parent / "trl-run"),
        per_device_train_batch_size=PROMPTS * GENERATIONS,
        num_generations=GENERATIONS,
        max_completion_length=NEW_TOKENS,
        temperature=1.0,
        learning_rate=1e-4,
        adam_beta2=0.98,
        weight_decay=0.0,
        max_grad_norm=1.0,
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        # fp32 like rlpost's CPU default (TRL's bf16 autocast crawls on CPUs without bf16
        # units), and no activation recompute, which rlpost's torch trainer does not do
        bf16=False,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        seed=1234,
    )
    timer = Timer()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        reward_funcs=[math_reward],
        args=config,
        train_dataset=data,
        callbacks=[timer],
    )
    first_step_at = time.time()
    trainer.train()
    measured = timer.steps[args.warmup :]
    result = {
        "end_to_end_s": time.time() - STARTED,
        "startup_s": first_step_at - STARTED,
        "steps_measured": len(measured),
        "loop_s": sum(measured),
        "samples": len(measured) * PROMPTS * GENERATIONS,
        "rewards": timer.rewards,
    }
    args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
