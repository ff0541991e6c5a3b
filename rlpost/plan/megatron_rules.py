"""The rules of Megatron-LM's `validate_args` that rlpost's plan, export and import rely on.

slime runs Megatron-LM's `validate_args` (megatron/training/arguments.py) on every launch.
Each rule below is one line of tests/fixtures/megatron_rules.txt, which
tools/gen_megatron_rules.py generates from Megatron-LM at the commit slime pins
(`MEGATRON_COMMIT`); tests/tools/test_gen_megatron_rules.py checks that each is at its line
there, so a new pin that moves or changes one fails a test instead of an exported launch.
"""

from __future__ import annotations

from dataclasses import dataclass

MEGATRON_COMMIT = "1dcf0daf"
"""The Megatron-LM slime's docker image pins (slime at rlpost.plan.slime_args.SLIME_COMMIT)."""
SOURCE = "megatron/training/arguments.py"


@dataclass(frozen=True)
class MegatronRule:
    line: int
    kind: str  # assert | raise | sets, as tools/gen_megatron_rules.py writes it
    text: str  # what the generated line says from its kind on (a prefix of it)
    relied_on: str  # where rlpost applies it, and how

    def cite(self) -> str:
        return f"{SOURCE}:{self.line} at Megatron-LM {MEGATRON_COMMIT}"


RULES = (
    MegatronRule(
        317,
        "assert",
        "args.world_size % total_model_size == 0",
        "rlpost/plan/checks.py refuses a train GPU count that tp x pp x cp does not divide",
    ),
    MegatronRule(
        814,
        "sets",
        "args.kv_channels = args.hidden_size // args.num_attention_heads",
        "rlpost/interop/slime_model.py and ModelConfig.megatron_kv_channels: a script without "
        "--kv-channels gets hidden / heads",
    ),
    MegatronRule(
        899,
        "assert",
        "args.recompute_method is None | when args.recompute_granularity == 'selective'",
        "rlpost/schema/layout.py (RecomputeConfig) refuses a recompute method without full "
        "granularity",
    ),
    MegatronRule(
        912,
        "sets",
        "args.sequence_parallel = False | when args.tensor_model_parallel_size == 1",
        "rlpost/interop/slime_import.py imports --sequence-parallel at TP 1 as off",
    ),
    MegatronRule(
        950,
        "assert",
        "os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') == '1'",
        "rlpost/plan/slime_args.py sets CUDA_DEVICE_MAX_CONNECTIONS=1 in the exported job's "
        "environment (TP or CP > 1 on Hopper)",
    ),
    MegatronRule(
        1026,
        "assert",
        "args.num_experts % args.expert_model_parallel_size == 0",
        "rlpost/plan/checks.py refuses an ep that does not divide the experts",
    ),
    MegatronRule(
        1190,
        "assert",
        "args.use_precision_aware_optimizer | when args.optimizer_cpu_offload",
        "rlpost/plan/slime_args.py refuses to export recipe.optim.cpu_offload without "
        "recipe.optim.precision_aware_optimizer (rlpost's own trainer runs the pair)",
    ),
)
"""The rules rlpost relies on, by their line at MEGATRON_COMMIT."""

BY_LINE = {rule.line: rule for rule in RULES}
