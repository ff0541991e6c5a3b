"""What a training launch checks on this machine before it starts anything.

The plan says whether a run can work on its hardware; the preflight says whether it can start
here: the checkpoint folders and data files it names exist and read (every jsonl line has its
keys; an HF folder given as model.load or model.ref_load is of the model's architecture), the
credentials and packages it will need are present, this node has the GPUs its hardware profile
describes (as many, with as much memory: `nvidia-smi`), the run directory can be written, and
the run fits in memory (plan.memory_check). `launch.py mode=train` and `rlpost validate` run
it; `mode=plan` does not, so a config meant for a cluster plans anywhere.

It sits above the plan: it reads this machine, its files and a Ray cluster's GCS, which the
plan (made anywhere, with no cluster) never does. One module per thing checked: checkpoints
(the checkpoint folders), tokens (the tokenizer and chat templates), data_files (the prompt
files, row by row), environment (packages, credentials, switches), machine (GPUs, host and
shared memory, the torch build), run_dir (the run directory, the resume target, the
checkpoints' disk) and cluster (the Ray cluster to join).

Standard library only, and quick: data files are parsed as JSON, never tokenized (prompt
length against data.max_prompt_len is judged when the tokenizer loads, still before anything
starts). What can only be judged while the run is under way (a reward server that answers,
a hook that raises on some sample) is handled by the run itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rlpost.errors import Issue, UserError
from rlpost.plan.fit import memory_issues, timeout_issues
from rlpost.plan.plan import Plan
from rlpost.preflight.checkpoints import check_checkpoints
from rlpost.preflight.cluster import check_cluster
from rlpost.preflight.data_files import check_data
from rlpost.preflight.environment import check_environment, check_switches
from rlpost.preflight.run_dir import check_run_dir
from rlpost.schema import RunConfig


def preflight(cfg: RunConfig, plan: Plan, *, machine: bool = True) -> list[Issue]:
    """Problems that would stop this training launch, and the memory verdict's warnings.

    Raises UserError listing every problem; returns the memory issues to warn about when
    plan.memory_check is `warn`. `machine=False` skips what depends on this machine (files,
    packages, GPUs, credentials): for a config meant to run elsewhere.
    """
    memory = memory_issues(cfg, plan)
    refused = list(memory) if cfg.plan.memory_check == "refuse" else []
    refused += timeout_issues(cfg, plan)
    if machine:
        for rule in MACHINE_CHECKS:
            refused.extend(rule(cfg, plan))
    if refused:
        title = "memory problem" if all(i in memory for i in refused) else "launch problem"
        raise UserError(refused, title=title)
    return memory


MachineCheck = Callable[[RunConfig, Plan], Iterable[Issue]]

MACHINE_CHECKS: tuple[MachineCheck, ...] = (
    check_checkpoints,
    check_data,
    check_environment,
    check_switches,
    check_cluster,
    check_run_dir,
)


__all__ = ["MACHINE_CHECKS", "MachineCheck", "preflight"]
