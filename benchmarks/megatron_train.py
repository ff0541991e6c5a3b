"""Training tokens/s, MFU and peak memory of rlpost's trainers (megatron-core or torch/FSDP2) on
a Qwen3 shape, and the same work as a plain PyTorch loop beside it.

    .venv/bin/python benchmarks/megatron_train.py --size tiny --steps 2     # CPU smoke run
    .venv/bin/python benchmarks/megatron_train.py --size tiny --steps 1 --baseline --profile
    python benchmarks/megatron_train.py --size 0.6b --steps 5 --baseline    # one GPU
    python benchmarks/megatron_train.py --size 1.7b layout.train.recompute.granularity=selective
    python benchmarks/megatron_train.py --size 0.6b --steps 3 --baseline trainer.backend=torch
    python benchmarks/megatron_train.py --size 0.6b --ragged --attention padded   # vs varlen

Composes conf/ (model qwen3-<size>, recipe grpo_dapo, one device, batch sizes as overrides),
plans it (build_plan), writes a random-weight HF checkpoint of the model YAML's shape (bf16 on
GPU, fp32 on CPU) and times the trainer's train_step on synthetic rollouts (--samples x
--seq-len tokens, a quarter prompt; dynamic batching): one warm-up rollout, then --steps. The
trainer is built as a run builds it on its train rank (rlpost.runtime.trainers: trainer_spec,
build_trainer), so it gets what the plan decides (layout, reference model, old-policy
logprobs, CUDA on a GPU profile) and its prediction.

The run is composed and planned first, with torch alone imported (whether CUDA is here decides
the dtype and the default profile): a run the plan refuses, or the torch trainer on a GPU
profile without CUDA, stops with its reason before megatron-core, transformers or the trainers
load (benchmarks/trainer_timing.py, imported once the plan accepts the run) and before any
measurement.

Which trainer: megatron-core, or with the override `trainer.backend=torch` the torch trainer,
which shards its model with FSDP2 over the one rank (bf16 compute over float32 shards on
CUDA, float32 on CPU). Its layout row names it with layout.train.fsdp's settings, and on a GPU
profile the plan's memory estimate is FSDP2's (rlpost.plan.fsdp: float32 shards, the gathered
root and layers, the reference's shard). The synthetic samples' prompts all differ, so the
torch trainer's prompt sharing (a group's prompt packed once) saves nothing here: both
trainers do the same work.

The presets' micro-batches (max_tokens_per_gpu) fit an 80 GB card for both loops: measured on
an H200, rlpost peaked at 21-56 GiB (0.6b, 16384 tokens) and 41 GiB (1.7b, full recompute) and
82.6 GiB for qwen3-4b at 16384 tokens, so 1.7b and 4b take 8192; a plain loop keeps float32
[tokens x vocab] logits and every layer's activations (0.6b at 16384 tokens, bf16 weights: 63
GiB; 1.7b: 89 GiB) on top of 16 bytes of float32 state per parameter.

--baseline: benchmarks/plain_loop.py on the same checkpoint, rollouts and micro-batch bound, in
this process after the trainer is gone; prints its tokens/s, memory and rlpost / plain.
--profile: one more rlpost train step counted for host reads, and one under torch.profiler
(benchmarks/step_profile.py).
--ragged: samples of a quarter to all of --seq-len tokens (seeded; no --baseline), the work the
megatron trainer's varlen attention saves over padding each group of a micro-batch's samples to its
longest. --attention: where the varlen kernel applies (CUDA, bf16), the megatron trainer takes the
padded path for the micro-batches on which it measured faster, padding counted (auto; the layout row
shows the measured speed), or never (varlen), or always (padded).

MFU = model FLOPs / (seconds x the hardware profile's peak_bf16_tflops), rlpost.plan.flops'
definition: 2 N + 4 L a s per token and forward, 3 forwards for training plus each no-grad
forward train_step ran (the reference model's, the old policy's unless the training forward's
own logprobs serve); recompute is not counted; the same for both trainers. The peak of a large
matmul measured here is printed beside it (bf16 8192^3 on GPU, fp32 1024^3 on CPU).

Memory: torch.cuda.max_memory_allocated against the plan's per-GPU training estimate less its
context/workspace overhead, which the allocator does not see, and the allocator's peak
reservation (max_memory_reserved, fragmentation included) against the whole estimate; on CPU
the growth of peak RSS from trainer construction on. The reference model's weights are what
this process holds of them: the torch trainer's are DTensor shards, counted by their local
tensors.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlpost import switches  # noqa: E402
from rlpost.config.loader import compose_run_config  # noqa: E402
from rlpost.errors import UserError  # noqa: E402
from rlpost.plan import Plan, build_plan  # noqa: E402
from rlpost.plan.flops import mfu  # noqa: E402
from rlpost.plan.fsdp import FsdpTrainMemory, fsdp_options  # noqa: E402
from rlpost.plan.layout import PADDED_ROWS_LIMIT  # noqa: E402
from rlpost.plan.memory import TrainMemory  # noqa: E402
from rlpost.plan.params import count_params  # noqa: E402
from rlpost.runtime.progress import trainer_notes_to_stderr  # noqa: E402
from rlpost.runtime.trainers import trainer_spec  # noqa: E402
from rlpost.schema import RunConfig  # noqa: E402

if TYPE_CHECKING:
    from plain_loop import PlainResult
    from trainer_timing import Measured

GIB = 1024**3
H100_GIB = 96  # a card with more memory plans as the H200 profile (141 GB), else the H100's


@dataclass(frozen=True)
class Preset:
    model: str  # conf/model/<model>.yaml
    seq_len: int
    samples: int
    max_tokens_per_gpu: int


PRESETS = {  # micro-batches that fit an 80 GB card for both loops (see the docstring)
    "tiny": Preset("qwen3-tiny", 128, 16, 1024),
    "0.6b": Preset("qwen3-0.6b", 4096, 32, 16384),
    "1.7b": Preset("qwen3-1.7b", 4096, 32, 8192),
    "4b": Preset("qwen3-4b", 4096, 32, 8192),
}


def compose_run(args: argparse.Namespace, hf_dir: Path, dtype: str) -> RunConfig:
    prompt = args.seq_len // 4
    response = args.seq_len - prompt
    group = math.gcd(args.samples, 8)
    overrides = [
        f"model={PRESETS[args.size].model}", "recipe=grpo_dapo", f"hardware={args.hardware}",
        "trainer.backend=megatron",  # the default here; trainer.backend=torch among overrides
        "hardware.gpus_per_node=1", "layout.train.num_gpus=1",
        f"model.hf_checkpoint={hf_dir}", f"model.params_dtype={dtype}",
        "model.load=null", f"model.ref_load={hf_dir}",  # never a torch_dist left on the machine
        f"recipe.data.max_prompt_len={prompt}", f"recipe.rollout.max_response_len={response}",
        f"recipe.eval.max_response_len={response}",
        f"recipe.rollout.batch_size={args.samples // group}",
        f"recipe.rollout.n_samples_per_prompt={group}",
        f"recipe.train.global_batch_size={args.global_batch or args.samples}",
        f"recipe.train.max_tokens_per_gpu={args.max_tokens_per_gpu}", *args.overrides,
    ]  # fmt: skip
    return compose_run_config(overrides)[0]


def sample_lengths(args: argparse.Namespace) -> list[int]:
    """Every sample --seq-len tokens, or with --ragged between a quarter of it and all of it
    (the same lengths in every rollout)."""
    if not args.ragged:
        return [args.seq_len] * args.samples
    rng = random.Random(1234)
    return [rng.randint(args.seq_len // 4, args.seq_len) for _ in range(args.samples)]


def default_hardware() -> str:
    """The conf/hardware profile of this machine: one H100 (80 GB) or one H200 (141 GB) by the
    first GPU's memory, or the CPU profile without CUDA. The plan then judges memory against
    the card the benchmark runs on."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    total_gib = torch.cuda.get_device_properties(0).total_memory / GIB
    return "h200x1" if total_gib > H100_GIB else "h100x1"


def check_trainer_device(run: RunConfig, plan: Plan, on_gpu: bool) -> None:
    """The torch trainer computes where its spec says (CUDA on a GPU profile): a profile this
    machine cannot compute on stops here, before anything is built or measured."""
    # only the device is read: the rendezvous and threads are the trainer's own, later
    spec = trainer_spec(run, plan, master_addr="127.0.0.1", master_port=0, num_threads=1)
    if spec.backend == "torch" and (spec.device == "cuda") != on_gpu:
        where = "has a" if on_gpu else "has no"
        raise SystemExit(
            f"--hardware {run.hardware.name}: the torch trainer would compute on "
            f"{spec.device}, but this machine {where} CUDA GPU; pass --hardware "
            f"{default_hardware()} (or leave it out)"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(PRESETS), default="0.6b")
    parser.add_argument("--steps", type=int, default=5, help="timed rollouts after one warm-up")
    parser.add_argument("--seq-len", type=int, help="tokens per sample (preset by --size)")
    parser.add_argument("--samples", type=int, help="samples per rollout (preset by --size)")
    parser.add_argument("--global-batch", type=int, help="samples per optimizer step (--samples)")
    parser.add_argument("--max-tokens-per-gpu", type=int, help="dynamic batch bound (preset)")
    parser.add_argument(
        "--hardware", help="conf/hardware profile (default: this machine's, default_hardware)"
    )
    parser.add_argument("--baseline", action="store_true", help="the plain loop too, and ratios")
    parser.add_argument("--profile", action="store_true", help="top kernels and host reads")
    parser.add_argument(
        "--ragged", action="store_true", help="samples of a quarter to all of --seq-len tokens"
    )
    parser.add_argument(
        "--attention", choices=("auto", "padded", "varlen"), default="auto",
        help="padded: the megatron trainer's padded SDPA path even where varlen applies; "
        "varlen: the varlen kernel wherever it applies (auto: the padded path for the "
        "micro-batches it measured faster on)",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides, applied last")
    args = parser.parse_args()
    preset = PRESETS[args.size]
    args.seq_len = args.seq_len or preset.seq_len
    args.samples = args.samples or preset.samples
    args.max_tokens_per_gpu = args.max_tokens_per_gpu or preset.max_tokens_per_gpu
    if args.ragged and args.baseline:
        parser.error("--baseline needs equal samples (the plain loop batches them unpadded)")
    args.lengths = sample_lengths(args)
    return args


def main() -> None:
    args = parse_args()
    trainer_notes_to_stderr()  # the trainers' notes (attention path, kernels) in the log, as a rank
    if args.attention == "varlen":
        os.environ[switches.PACKED_ATTENTION.name] = "varlen"
    import torch  # alone: whether CUDA is here decides the checkpoint's dtype and the profile

    on_gpu = torch.cuda.is_available()
    args.hardware = args.hardware or default_hardware()
    plain = None
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / "hf"
        try:
            run = compose_run(args, hf_dir, "bf16" if on_gpu else "fp32")
            plan = build_plan(run)
        except UserError as error:  # a run the plan refuses (one that would not fit) stops here
            print(error, file=sys.stderr)
            raise SystemExit(2) from None
        check_trainer_device(run, plan, on_gpu)
        # the plan accepts the run: megatron-core, the trainers and the plain loop load now
        import trainer_timing as timing

        from rlpost.backends.megatron import kernels

        if args.attention == "padded":
            kernels.VARLEN_ATTN = None  # packed_attention then takes the padded path everywhere
        device = torch.device("cuda" if on_gpu else "cpu")
        peak = timing.measure_peak_flops(device)
        timing.write_checkpoint(run.model, hf_dir, device)
        vocab = run.model.vocab_size
        rollouts = [timing.rollout(args.lengths, vocab, s) for s in range(args.steps + 1)]
        measured = timing.time_trainer(run, plan, rollouts, args.profile)
        report(args, plan, run, peak, measured)  # before the plain loop, which may not fit
        if args.baseline:
            recompute = plan.parallel.recompute == "full"
            lr = run.recipe.optim.lr
            plain = timing.time_plain_loop(hf_dir, rollouts, lr, recompute, args.max_tokens_per_gpu)
    if plain is not None:
        report_baseline(args, plan, measured, plain, on_gpu)
    if measured.profile:
        print(f"\nrlpost train step, profiled\n{measured.profile}")


def print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


def padded_rows_per_token(lengths: list[int], run: RunConfig) -> float:
    """The rows the padded attention takes per token over the rollout's micro-batches (each
    group of samples of similar lengths padded to its longest, rlpost.algo.packing)."""
    from rlpost.algo.packing import padded_rows
    from rlpost.algo.steps import micro_batches

    rows = 0
    for micro_batch in micro_batches(lengths, run.recipe.train):
        rows += padded_rows([lengths[i] for i in micro_batch])
    return rows / sum(lengths)


def tokens_per_s(args: argparse.Namespace, rollouts: int, elapsed_s: float) -> float:
    lengths: list[int] = args.lengths  # sample_lengths(args)
    return sum(lengths) * rollouts / elapsed_s


def report(
    args: argparse.Namespace,
    plan: Plan,
    run: RunConfig,
    peak: tuple[float, str],
    measured: Measured,
) -> None:
    from rlpost.backends import sdpa
    from rlpost.backends.megatron import kernels

    model = run.model
    steps = measured.steps
    rate = tokens_per_s(args, len(steps), measured.elapsed_s)
    extra = measured.extra_forwards
    flops = plan.prediction.flops
    forwards = 3 + len(extra)
    step_flops = flops.over(args.lengths, forwards)
    tokens = sum(args.lengths)
    shape = f"{args.samples} samples x {args.seq_len} tokens"
    if args.ragged:
        shape = f"{args.samples} samples of {min(args.lengths)}-{max(args.lengths)} tokens"
    step_s = measured.elapsed_s / len(steps)
    gpus = plan.placement.train_gpus
    mem = plan.memory.train
    mean = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}
    paths = kernels.ATTENTION_PATHS  # the megatron trainer's, every step of this process
    planned, refused = sdpa.cudnn_plans()  # both trainers' padded attention, on Hopper
    since = "; new shapes since then did not" if refused else ""
    rows = [
        ("model", f"{model.name} ({count_params(model).total / 1e6:,.1f}M params, "
                  f"{model.params_dtype}), random weights"),
        ("layout", layout_row(run, plan, args.attention)),
        ("rollout", f"{shape} ({tokens:,} in all), "
                    f"{mean['train/optimizer_steps']:.0f} optimizer step(s), "
                    f"{mean['train/micro_batches']:.0f} micro-batches of <= "
                    f"{args.max_tokens_per_gpu} tokens"),
        ("packing efficiency", f"{mean.get('train/packing_efficiency', math.nan):.3f}"),
        ("padded rows per token", f"{padded_rows_per_token(args.lengths, run):.3f} (where the "
                                  f"padded path runs; the plan counts {PADDED_ROWS_LIMIT})"),
        *([("padded attention share", f"{paths['padded'] / paths.total():.3f} of "
                                         f"{paths.total():,} attention calls")]
          if paths.total() else []),
        *([("cuDNN attention plans", f"{planned} padded shapes asked cuDNN first (at most "
                                     f"{sdpa.CUDNN_PLANS}){since}")]
          if planned else []),
        ("timed rollouts (after 1 warm-up)", f"{len(steps)}"),
        ("step time s (mean; no-grad forwards)",
         f"{step_s:.3f} ({mean['train/prepare_time_s']:.3f})"),
        ("train tokens/s", f"{rate:,.1f}"),
        ("forwards per token", f"3 (train) + {len(extra)} ({', '.join(extra) or 'none'})"),
        ("model GFLOP per token", f"{step_flops / tokens / 1e9:.4f} "
         f"(forward {flops.over(args.lengths, 1) / tokens / 1e9:.4f})"),
        ("achieved TFLOP/s", f"{step_flops / step_s / 1e12:.3f}"),
        (f"MFU (of {args.hardware}'s {plan.prediction.peak_tflops:g} TFLOP/s)",
         f"{mfu(step_flops, step_s, gpus, plan.prediction.peak_tflops):.3f}"),
        ("measured peak TFLOP/s; MFU of it",
         f"{peak[0] / 1e12:.3f} ({peak[1]}); {step_flops / step_s / peak[0]:.3f}"),
        (measured.memory_label, f"{measured.memory_gib:.3f}"),
        *([("max_memory_reserved GiB", f"{measured.reserved_gib:.3f}")]
          if measured.reserved_gib else []),
        ("plan train estimate GiB/GPU", plan_memory_row(mem)),
        reference_row(plan, measured.reference_gib),
        ("measured / (estimate - overhead)",
         f"{measured.memory_gib / (mem.total_gib - mem.overhead_gib):.3f}"),
        *([("reserved / estimate", f"{measured.reserved_gib / mem.total_gib:.3f}")]
          if measured.reserved_gib else []),
        ("step time / plan's training seconds",
         f"{step_s / plan.prediction.train_s:.3f} (plan {plan.prediction.train_s:.3f} s)"),
    ]  # fmt: skip
    print_rows(rows)


def layout_row(run: RunConfig, plan: Plan, attention: str = "auto") -> str:
    par = plan.parallel
    if plan.trainer_backend != "torch":
        from rlpost.backends.megatron import kernels

        measured = ", ".join(f"{v:.2f}x" for v in kernels._padded_speedups.values())
        sdpa = {
            "padded": "padded SDPA (--attention padded)",
            "varlen": "varlen where it applies (--attention varlen)",
        }.get(attention, "varlen or padded" + (f" (padded measured {measured} the varlen "
                                                "kernel's speed per unit of work)"
                                                if measured else ""))  # fmt: skip
        return (
            f"tp {par.tp} pp {par.pp} cp {par.cp} dp {par.dp}, recompute {par.recompute}, "
            f"attention {sdpa}"
        )
    fsdp = fsdp_options(run)
    shards = fsdp.shards(par.dp)
    gpu = run.hardware.kind == "gpu"
    compute = f"{run.model.params_dtype} over float32 shards" if gpu else "float32"
    offload = "on" if fsdp.cpu_offload else "off"
    section = getattr(run.layout.train, "fsdp", None)
    reshard = getattr(section, "reshard_after_forward", None)
    if reshard is None:  # the trainer's default: true on CUDA, false (one unit) on CPU
        reshard = run.hardware.kind == "gpu"
    return (
        f"torch trainer, FSDP2 over dp {par.dp} (shard group {shards}, cpu_offload {offload}, "
        f"reshard_after_forward {str(reshard).lower()}), {compute}, recompute {par.recompute}"
    )


def plan_memory_row(mem: TrainMemory) -> str:
    """The plan's per-GPU training estimate and its terms: FSDP2's for the torch trainer on
    a GPU profile (float32 shards, gathered parameters, the reference's shard), else
    megatron-core's (on the cpu profile, the torch trainer's too)."""
    common = (
        f"activations {mem.activations_gib:.3f}, logits {mem.logits_gib:.3f}, "
        f"overhead {mem.overhead_gib:.3f}"
    )
    if not isinstance(mem, FsdpTrainMemory):
        return (
            f"{mem.total_gib:.3f} (weights {mem.weights_gib:.3f}, grads {mem.grads_gib:.3f}, "
            f"optimizer {mem.optimizer_gib:.3f}, {common})"
        )
    host = f"; on the host {mem.host_optimizer_gib:.3f}" if mem.cpu_offload else ""
    return (
        f"{mem.total_gib:.3f} (float32 shards of {mem.shards}: weights {mem.weights_gib:.3f}, "
        f"grads {mem.grads_gib:.3f}, optimizer {mem.optimizer_gib:.3f}; gathered "
        f"{mem.gathered_gib:.3f}, reference {mem.reference_gib:.3f}, {common}{host})"
    )


def reference_row(plan: Plan, reference_gib: float) -> tuple[str, str]:
    """The reference model's weights this process holds; the plan counts them only in
    FSDP2's estimate."""
    if plan.trainer_backend != "torch":
        return "reference weights GiB (not estimated)", f"{reference_gib:.3f}"
    mem = plan.memory.train
    if not isinstance(mem, FsdpTrainMemory):
        return "reference weights GiB (local shards, not estimated)", f"{reference_gib:.3f}"
    if mem.cpu_offload:  # the plan counts the reference's shard among the host's state
        return "reference weights GiB (local shards, on the host)", f"{reference_gib:.3f}"
    return (
        "reference weights GiB (local shards)",
        f"{reference_gib:.3f} (plan {mem.reference_gib:.3f})",
    )


def report_baseline(
    args: argparse.Namespace, plan: Plan, measured: Measured, plain: PlainResult, on_gpu: bool
) -> None:
    steps = len(measured.steps)
    ours = tokens_per_s(args, steps, measured.elapsed_s)
    theirs = tokens_per_s(args, steps, plain.elapsed_s)
    compute = "bf16 autocast over float32 weights" if on_gpu else "float32"
    memory = "max_memory_allocated" if on_gpu else "peak RSS of this process"
    recompute = ", every layer checkpointed" if plan.parallel.recompute == "full" else ""
    rows = [
        ("plain loop", f"HF model, SDPA, {compute}, AdamW float32 states, "
                       f"{plain.micro_batch_samples} samples per micro-batch{recompute}"),
        ("plain train tokens/s", f"{theirs:,.1f}"),
        (f"plain {memory} GiB", f"{plain.peak_memory_gib:.3f}"
         + (f" (less {plain.held_gib:.3f} GiB held before it)" if plain.held_gib else "")),
        ("rlpost / plain tokens/s", f"{ours / theirs:.3f}"),
    ]  # fmt: skip
    if on_gpu:
        rows.append(("rlpost / plain memory", f"{measured.memory_gib / plain.peak_memory_gib:.3f}"))
    print()
    print_rows(rows)


if __name__ == "__main__":
    main()
