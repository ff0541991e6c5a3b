"""`rlpost slurm` and `rlpost kuberay`: a scheduler's job for a run, written from its plan.

    rlpost slurm model=glm4.5-355b-a32b recipe=grpo_dapo hardware=h100x64 --partition gpu
    rlpost kuberay model=qwen3-4b recipe=grpo_dapo hardware=h100x16 --image IMG --pvc runs

Both compose and plan the run first (a config error stops here, exit 2), then write a file
that is generated, never edited: regenerate it after a change. The sbatch script asks for
the plan's nodes and GPUs, starts the Ray head on the first node and one worker per other
node through srun (each `ray start --block`, its log in the run directory), waits until every
node has registered, and launches the run on the head with the same overrides; it asks for
SIGTERM ahead of the time limit for itself alone and hands it to the launch, which saves and
stops while Ray still runs (at the limit Slurm signals every step at once); an evaluation
saves nothing, and neither does a training run with `run.on_sigterm: stop`: their lead is a
minute to stop. The RayJob
has a head group and a worker group sized from the hardware profile, the launch as its
entrypoint, the run directory on a volume every pod mounts, and preStop hooks that let the
launch save before a deletion stops Ray.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib.metadata import version
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from rlpost.cli.target import Target, add_target_arguments, target_from_args
from rlpost.errors import Issue, UserError
from rlpost.runtime.rundir import LOCK_FILE
from rlpost.schema import RunConfig

if TYPE_CHECKING:
    from rlpost.plan import Plan

SLURM_HELP = "write an sbatch script for a run: a Ray cluster over the job's nodes, then the launch"
KUBERAY_HELP = "write a KubeRay RayJob manifest for a run (head and worker groups, the launch)"
RAY_PORT = 6379
ROOT = Path(__file__).resolve().parents[2]  # where launch.py is
TOKEN_SECRET_KEY = "auth_token"


def _planned(args: argparse.Namespace) -> tuple[Target, RunConfig, Plan]:
    """The run's config, checked and planned, and the launch's own checks of it that do not
    depend on this machine (the memory verdict, timeouts): a job the launch would refuse is
    not written. Its files, packages and GPUs are the cluster's, never checked here: what
    --no-local-checks asks of `rlpost validate` is what a job's command always does."""
    from rlpost.cli.planning import located, plan_run
    from rlpost.cli.validate import MODE_CHECKS
    from rlpost.config.loader import compose_run_config
    from rlpost.config.overrides import refuse_sweeps

    target = target_from_args(args)
    verb = f"rlpost {args.verb}" if getattr(args, "verb", None) else "this command"
    refuse_sweeps(
        target.overrides,
        "a scheduler's job runs one launch",
        f"write a job per value ({verb} ... {{first}} for the first)"
        + (", each with a --run-dir of its own" if verb == "rlpost slurm" else ""),
    )
    refuse_job_keys(target.overrides, verb)
    cfg, sources = compose_run_config(
        target.overrides, config_dir=target.config_dir, config_name=target.config_name
    )
    if cfg.mode not in ("train", "eval"):
        raise UserError(
            [
                Issue(
                    "mode",
                    "a scheduler's job runs a launch that trains or evaluates, and "
                    f"mode={cfg.mode} prints on this machine and runs nothing",
                    f"run `python launch.py mode={cfg.mode} ...` here, or drop mode= (or give "
                    "mode=eval) to schedule a run",
                    value=cfg.mode,
                )
            ]
        )
    cfg, plan = plan_run(cfg, sources)
    with located(sources):
        MODE_CHECKS[cfg.mode](cfg, plan, False)
    return target, cfg, plan


# What a job's launch is given by the job itself, after the overrides (the last value of a key
# is the one Hydra keeps): an override of one of them would be dropped without a word.
JOB_KEYS = ("run.dir", "run.ray_address", "run.node_address")


def refuse_job_keys(overrides: Sequence[str], verb: str) -> None:
    """Refuse an override of a key the job sets: the run directory (--run-dir, or the RayJob's
    volume) and the cluster the launch joins (the head the job starts)."""
    issues = []
    for token in overrides:
        key, _, value = token.partition("=")
        key = key.lstrip("+~")
        if key not in JOB_KEYS:
            continue
        if key == "run.dir":
            why, fix = (
                ("the job's run directory is --run-dir", f"give it as --run-dir {value}")
                if verb == "rlpost slurm"
                else (
                    "the RayJob's run directory is <--runs-mount>/<job name> on the --pvc volume",
                    "drop it, and name the volume with --pvc (--runs-mount: where it mounts)",
                )
            )
        else:
            why = (
                "the job starts its own Ray cluster and its launch joins that cluster's head "
                "(the job sets run.ray_address and run.node_address after the overrides)"
            )
            fix = "drop it: the job's launch always runs on the head of the cluster it starts"
        issues.append(
            Issue(key, f"{why}, so this override would be dropped without a word", fix, value)
        )
    if issues:
        raise UserError(issues, title="command-line error")


def job_name(cfg: RunConfig) -> str:
    """rlpost-<model>-<recipe>, and -eval for mode=eval, as a DNS-1123 label (Kubernetes
    names, Slurm job names). An evaluation's name is its own: a RayJob's run directory is
    named for its job, and mode=eval refuses a training run's directory."""
    evaluation = "-eval" if cfg.mode == "eval" else ""
    raw = f"rlpost-{cfg.model.name}-{cfg.recipe.name}{evaluation}".lower()
    return re.sub(r"[^a-z0-9-]+", "-", raw).strip("-")[:63].rstrip("-")


def _launch_argv(target: Target, cfg: RunConfig) -> list[str]:
    """The launch's arguments. The job sets run.dir; an evaluation keeps its mode=eval, and a
    mode=train given keeps its place over a config file's mode: eval; a training run
    continues its run directory's newest checkpoint (run.resume=auto, which starts at rollout
    0 in a directory that holds none) unless it names what to resume, so that the same job
    submitted again after a stop at the time limit, a preemption or a deleted RayJob
    continues the run, where a fresh start there is refused."""
    given = target.launcher_argv()
    argv = [a for a in given if not a.startswith(("run.dir=", "mode="))]
    if cfg.mode == "eval":
        return [*argv, "mode=eval"]
    if any(a.startswith("mode=") for a in given):  # over a config file's mode: eval
        argv.append(f"mode={cfg.mode}")
    if cfg.run.resume is None and not any(a.startswith("run.resume=") for a in argv):
        argv.append("run.resume=auto")
    return argv


def _resources(cfg: RunConfig) -> str:
    hw = cfg.hardware
    if hw.kind == "gpu":
        return f"--num-gpus={hw.gpus_per_node} --num-cpus={hw.cpus_per_node}"
    return f"--num-cpus={hw.gpus_per_node} --num-gpus=0"


def _node_ip(cfg: RunConfig) -> str:
    """Shell that prints this node's cluster address."""
    ifname = cfg.hardware.socket_ifname
    if ifname:
        return (
            f"ip -4 -o addr show {shlex.quote(ifname)} "
            "| awk '{split($4, a, \"/\"); print a[1]; exit}'"
        )
    return "hostname --ip-address | awk '{print $1}'"


# @NAME@ marks what render_sbatch fills in; everything else is the script as written.
SBATCH_BODY = r"""set -euo pipefail

RUN_DIR=@RUN_DIR@
RLPOST_DIR=@RLPOST_DIR@
PYTHON=@PYTHON@
RAY="$(dirname "$PYTHON")/ray"
PORT=@PORT@
NODE_IP=@NODE_IP@
mkdir -p "$RUN_DIR/logs"

# Token authentication: one token on the shared home (~/.ray/auth_token) for every node.
export RAY_AUTH_MODE=token
"$RAY" get-auth-token --generate > /dev/null

mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD="${NODES[0]}"
HEAD_IP="$(srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" bash -c "$NODE_IP")"

# The head on the first node, a worker on each other node, each `ray start --block` in its
# own step with its log in the run directory.
srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" \
    "$RAY" start --head --block --node-ip-address="$HEAD_IP" --port="$PORT" @RESOURCES@ \
    --disable-usage-stats --include-dashboard=false > "$RUN_DIR/logs/ray-head.log" 2>&1 &
for i in $(seq 60); do
    "$RAY" status --address "$HEAD_IP:$PORT" > /dev/null 2>&1 && break
    sleep 2
done
for node in "${NODES[@]:1}"; do
    srun --overlap --nodes=1 --ntasks=1 -w "$node" bash -c \
        'exec "$0" start --block --address="$1" --node-ip-address="$(eval "$2")" "${@:3}"' \
        "$RAY" "$HEAD_IP:$PORT" "$NODE_IP" @RESOURCES@ --disable-usage-stats \
        > "$RUN_DIR/logs/ray-worker-$node.log" 2>&1 &
done
"$PYTHON" -m rlpost.cli.main cluster wait --address "$HEAD_IP:$PORT" \
    --node-address "$HEAD_IP" --nodes @NODES@ --timeout 600

# The run, on the head, with the same overrides. At the time limit Slurm signals every step
# at once, Ray's with the run's, and the run could not @STOP_HOW@; so this script asks for
# SIGTERM @LEAD@ s ahead, for itself alone (--signal=B:TERM), and hands it to the launch (srun
# passes a SIGTERM on to its task), which
# @STOPS@ while Ray still runs; the job ends with it.
cd "$RLPOST_DIR"
LAUNCH_PID="" STOP=""
trap 'STOP=1; [ -z "$LAUNCH_PID" ] || kill -TERM "$LAUNCH_PID" 2> /dev/null || true' TERM
srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" "$PYTHON" launch.py @LAUNCH@ \
    run.dir="$RUN_DIR" run.ray_address="$HEAD_IP:$PORT" run.node_address="$HEAD_IP" &
LAUNCH_PID=$!
[ -z "$STOP" ] || kill -TERM "$LAUNCH_PID" 2> /dev/null || true  # a signal before the launch
status=0
wait "$LAUNCH_PID" || status=$?
while kill -0 "$LAUNCH_PID" 2> /dev/null; do  # the trapped signal ended the wait early
    status=0
    wait "$LAUNCH_PID" || status=$?
done
exit "$status"
"""


MIN_STOP_LEAD_S = 300
MAX_SIGNAL_S = 65535  # sbatch --signal's sig_time: 0 to 65535 s
SAVE_ALLOWANCE_S = 300
# A run that stops at once on SIGTERM saves nothing (an evaluation, or a training run with
# run.on_sigterm: stop): its lead is the time to end its engines and actors while Ray still
# runs, not a rollout's training and a save.
STOP_AT_ONCE_LEAD_S = 60


@dataclass(frozen=True)
class SigtermStop:
    """What the planned launch does with the job's SIGTERM (the plan's runtime.on_sigterm)."""

    saves: bool
    evaluation: bool

    @classmethod
    def of(cls, cfg: RunConfig, plan: Plan) -> SigtermStop:
        return cls(plan.runtime.on_sigterm == "save", cfg.mode == "eval")

    def stops(self) -> str:
        """What the launch does, for the job file's comment."""
        if self.evaluation:
            return "stops the evaluation at once (it saves nothing)"
        if self.saves:
            return "saves every finished rollout and stops"
        return (
            "stops at once (run.on_sigterm: stop: it saves nothing and keeps the checkpoints "
            "it has)"
        )


SAVES = SigtermStop(saves=True, evaluation=False)


def stop_lead_s(train_s: float, asked: int | None, on_sigterm: SigtermStop = SAVES) -> int:
    """Seconds before the time limit the launch is told to stop: `--stop-lead` when given;
    for a launch that stops at once (mode=eval, run.on_sigterm: stop) one minute to stop;
    else the plan's training time per rollout (the rollout a stop lets finish) and 5 minutes
    for the save, in whole minutes, 5 at least."""
    if asked is not None:
        return asked
    if not on_sigterm.saves:
        return STOP_AT_ONCE_LEAD_S
    return max(MIN_STOP_LEAD_S, 60 * math.ceil((train_s + SAVE_ALLOWANCE_S) / 60))


_SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def slurm_time_s(text: str) -> int | None:
    """sbatch --time in seconds: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
    days-hours:minutes, days-hours:minutes:seconds; None for what is not one of them."""
    match = _SLURM_TIME.fullmatch(text.strip())
    if match is None:
        return None
    days, first, second, third = (int(g) if g else None for g in match.groups())
    assert first is not None
    if days is not None:  # days-hours[:minutes[:seconds]]
        return ((days * 24 + first) * 60 + (second or 0)) * 60 + (third or 0)
    if third is not None:  # hours:minutes:seconds
        return (first * 60 + (second or 0)) * 60 + third
    return first * 60 + (second or 0)  # minutes[:seconds]


def _check_stop_lead(lead: int, time: str | None, on_sigterm: SigtermStop = SAVES) -> None:
    saves, evaluation = on_sigterm.saves, on_sigterm.evaluation
    stop = "stop and save" if saves else "stop"
    needs = "it must cover a rollout's training and a save" if saves else "it must cover stopping"
    default = (
        "the plan's training time per rollout plus 5 minutes"
        if saves
        else f"{STOP_AT_ONCE_LEAD_S} s to stop "
        + ("an evaluation" if evaluation else "a run that saves nothing on SIGTERM")
    )
    if not 0 < lead <= MAX_SIGNAL_S:
        raise UserError(
            [
                Issue(
                    "--stop-lead",
                    f"is when, in seconds before the time limit, the launch is told to {stop}; "
                    f"Slurm's --signal=B:TERM@<seconds> takes 0 to {MAX_SIGNAL_S}, and at 0 the "
                    f"signal comes with the kill, too late to {'save' if saves else 'stop'}",
                    f"give 1 to {MAX_SIGNAL_S} seconds (e.g. --stop-lead {MIN_STOP_LEAD_S}), or "
                    f"leave it out for {default}",
                    value=lead,
                )
            ],
            title="command-line error",
        )
    limit = slurm_time_s(time) if time else None
    if time and limit is None:
        raise UserError(
            [
                Issue(
                    "--time",
                    "is not a Slurm time limit",
                    "write minutes, hours:minutes:seconds or days-hours[:minutes[:seconds]], "
                    "e.g. 24:00:00 or 2-00:00:00",
                    value=time,
                )
            ],
            title="command-line error",
        )
    if limit is not None and lead >= limit:
        raise UserError(
            [
                Issue(
                    "--stop-lead",
                    f"the launch would be told to stop {lead} s before the time limit, and the "
                    f"job has {limit} s in all: it would stop before it "
                    f"{'evaluated' if evaluation else 'trained'} anything",
                    f"ask for a longer --time, or a shorter --stop-lead ({needs})",
                    value=lead,
                )
            ],
            title="command-line error",
        )


def render_sbatch(
    cfg: RunConfig,
    target: Target,
    args: argparse.Namespace,
    train_s: float = 0.0,
    on_sigterm: SigtermStop = SAVES,
) -> str:
    """The script; `train_s`: the plan's training seconds per rollout (the stop's lead)."""
    hw = cfg.hardware
    run_dir = Path(args.run_dir).resolve()
    lead = stop_lead_s(train_s, getattr(args, "stop_lead", None), on_sigterm)
    _check_stop_lead(lead, args.time, on_sigterm)
    directives = [
        f"--job-name={job_name(cfg)}",
        f"--nodes={hw.num_nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={hw.cpus_per_node}",
        "--exclusive",
        f"--output={run_dir}/logs/slurm-%j.out",
        f"--signal=B:TERM@{lead}",
    ]
    if hw.kind == "gpu":
        directives.insert(3, f"--gpus-per-node={hw.gpus_per_node}")
    for flag in ("partition", "account", "time"):
        if getattr(args, flag):
            directives.append(f"--{flag}={getattr(args, flag)}")
    if target.config_dir:  # the script runs launch.py from --rlpost-dir, not from here
        target = replace(target, config_dir=str(Path(target.config_dir).resolve()))
    launch = shlex.join(_launch_argv(target, cfg))
    fills = {
        "RUN_DIR": shlex.quote(str(run_dir)),
        "RLPOST_DIR": shlex.quote(str(args.rlpost_dir or ROOT)),
        "PYTHON": shlex.quote(args.python or sys.executable),
        "PORT": str(RAY_PORT),
        "NODE_IP": shlex.quote(_node_ip(cfg)),
        "RESOURCES": _resources(cfg),
        "NODES": str(hw.num_nodes),
        "LAUNCH": launch,
        "LEAD": str(lead),
        "STOP_HOW": "save" if on_sigterm.saves else "stop cleanly",
        "STOPS": on_sigterm.stops(),
    }
    body = SBATCH_BODY
    for name, value in fills.items():
        body = body.replace(f"@{name}@", value)
    head = [
        "#!/bin/bash",
        f"# Generated by `rlpost slurm` from the plan of: {launch}",
        "# Regenerate it after a change; do not edit. Submit: sbatch <this file>",
        *(f"#SBATCH {d}" for d in directives),
    ]
    return "\n".join(head) + "\n" + body


# What a pod asks of its node's CPUs and memory by default: a node's allocatable is below its
# capacity (the kubelet's and the system's reservations, the eviction threshold, daemon sets),
# so a pod asking for a whole node of the profile would never be scheduled.
POD_SHARE = 0.9


@dataclass(frozen=True)
class PodSize:
    cpus: int
    memory_gib: int


def pod_size(cfg: RunConfig, plan: Plan, args: argparse.Namespace) -> PodSize:
    """The CPUs and memory each Ray pod asks for (`--pod-cpus`, `--pod-memory-gib`, else
    POD_SHARE of the profile's node), refused where the node cannot give them or the run
    cannot live in them."""
    hw = cfg.hardware
    cpus = args.pod_cpus or max(1, int(hw.cpus_per_node * POD_SHARE))
    memory = args.pod_memory_gib or max(1, int(hw.host_memory_gib * POD_SHARE))
    issues = []
    if cpus > hw.cpus_per_node:
        issues.append(
            Issue(
                "--pod-cpus",
                f"{cpus} CPUs is more than a node of hardware={hw.name} has "
                f"({hw.cpus_per_node}): no node could schedule the pod",
                f"ask for at most {hw.cpus_per_node}, less what the node reserves",
                value=cpus,
            )
        )
    slots = hw.gpus_per_node
    # on a GPU profile Ray counts the pod's CPUs and each slot's bundle takes one; a CPU
    # profile's Ray is started with one logical CPU per slot (_start_params), whatever the pod has
    if hw.kind == "gpu" and cpus < slots:
        issues.append(
            Issue(
                "--pod-cpus",
                f"{cpus} CPUs is fewer than the node's {slots} device slots, and each slot's "
                "Ray bundle reserves a CPU: the placement group would never be created",
                f"ask for at least {slots}",
                value=cpus,
            )
        )
    if memory > hw.host_memory_gib:
        issues.append(
            Issue(
                "--pod-memory-gib",
                f"{memory} GiB is more than a node of hardware={hw.name} has "
                f"({hw.host_memory_gib:g}): no node could schedule the pod",
                f"ask for at most {int(hw.host_memory_gib)}, less what the node reserves",
                value=memory,
            )
        )
    needs = plan.memory.host.total_gib
    if memory < needs:
        issues.append(
            Issue(
                "--pod-memory-gib",
                f"the run keeps {needs:,.1f} GiB in host memory on a node (offloaded optimizer "
                f"state, reference weights), more than the pod's {memory} GiB: Kubernetes "
                "would kill the pod when it got there",
                f"ask for at least {int(needs) + 1} GiB (--pod-memory-gib), or a layout that "
                "keeps less on the host",
                value=memory,
            )
        )
    if issues:
        raise UserError(issues, title="command-line error")
    return PodSize(cpus, memory)


def _container(
    cfg: RunConfig, args: argparse.Namespace, name: str, size: PodSize | None = None
) -> dict[str, Any]:
    hw = cfg.hardware
    limits: dict[str, Any] = {}
    if size is not None:
        limits = {"cpu": str(size.cpus), "memory": f"{size.memory_gib}Gi"}
    if hw.kind == "gpu" and size is not None:
        limits["nvidia.com/gpu"] = hw.gpus_per_node
    env = [
        *({"name": k, "value": v} for k, v in getattr(args, "env_vars", {}).items()),
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {
            "name": "RAY_AUTH_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": args.token_secret, "key": TOKEN_SECRET_KEY}},
        },
    ]
    container: dict[str, Any] = {
        "name": name,
        "image": args.image,
        "env": env,
        "resources": {"limits": limits, "requests": dict(limits)},
        "volumeMounts": [{"name": "runs", "mountPath": args.runs_mount}],
    }
    if name == "ray-head":
        container["ports"] = [
            {"containerPort": RAY_PORT, "name": "gcs-server"},
            {"containerPort": 8265, "name": "dashboard"},
        ]
    return container


# Deleting a RayJob (or its cluster) signals every pod at once: the Ray workers would go while
# the launch saves. Kubernetes runs a container's preStop hook before it sends SIGTERM, and
# gives hook and stop terminationGracePeriodSeconds together. The head's hook hands SIGTERM to
# the launch (the pid its run directory's lock names, when that process is the launch) and
# waits until it has saved and ended; each worker's waits while the head's Ray still answers
# (KubeRay sets FQ_RAY_IP and RAY_PORT in worker pods), so the workers stay until the head goes.
HEAD_PRE_STOP = """\
pid=""; read -r pid < {lock} 2> /dev/null || true
case "$pid" in "" | *[!0-9]*) exit 0 ;; esac
grep -qa launch.py "/proc/$pid/cmdline" 2> /dev/null || exit 0  # not the launch: a stale lock
kill -TERM "$pid" 2> /dev/null || exit 0
end=$((SECONDS + {lead}))
while kill -0 "$pid" 2> /dev/null && [ "$SECONDS" -lt "$end" ]; do sleep 1; done
"""
WORKER_PRE_STOP = """\
end=$((SECONDS + {lead}))
while [ "$SECONDS" -lt "$end" ] && (: <> "/dev/tcp/$FQ_RAY_IP/${{RAY_PORT:-{port}}}") 2> /dev/null
do sleep 2; done
"""
RAY_STOP_S = 30  # after the hook: Ray's own stop, within the grace period


def pre_stop_script(role: str, lead_s: int, run_dir: str) -> str:
    """The bash a `role` ('ray-head' or 'ray-worker') pod runs before its SIGTERM."""
    if role == "ray-head":
        return HEAD_PRE_STOP.format(lock=shlex.quote(f"{run_dir}/{LOCK_FILE}"), lead=lead_s)
    return WORKER_PRE_STOP.format(lead=lead_s + RAY_STOP_S, port=RAY_PORT)


def _pod(
    cfg: RunConfig,
    args: argparse.Namespace,
    name: str,
    size: PodSize,
    lead_s: int = MIN_STOP_LEAD_S,
    run_dir: str = "",
) -> dict[str, Any]:
    container = _container(cfg, args, name, size)
    script = pre_stop_script(name, lead_s, run_dir)
    container["lifecycle"] = {"preStop": {"exec": {"command": ["/bin/bash", "-c", script]}}}
    # a worker waits for the head's hook and the head's Ray to stop, then stops itself
    grace = lead_s + RAY_STOP_S * (1 if name == "ray-head" else 2)
    return {
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "containers": [container],
            "volumes": [
                {"name": "runs", "persistentVolumeClaim": {"claimName": args.pvc}}
                if args.pvc
                else {"name": "runs", "emptyDir": {}}
            ],
        }
    }


def _start_params(cfg: RunConfig, size: PodSize) -> dict[str, str]:
    hw = cfg.hardware
    if hw.kind == "gpu":  # Ray counts the CPUs the pod has, not the node's
        return {"num-gpus": str(hw.gpus_per_node), "num-cpus": str(size.cpus)}
    return {"num-cpus": str(hw.gpus_per_node), "num-gpus": "0"}


def pod_stop_lead_s(cfg: RunConfig, plan: Plan, args: argparse.Namespace) -> int:
    """How long a deleted or preempted head pod gives the launch before Ray stops."""
    lead = stop_lead_s(
        plan.prediction.train_s, getattr(args, "stop_lead", None), SigtermStop.of(cfg, plan)
    )
    if lead <= 0:
        raise UserError(
            [
                Issue(
                    "--stop-lead",
                    "is how long a deleted or preempted head pod gives the launch to save "
                    "(an evaluation or run.on_sigterm: stop: to stop) before Kubernetes stops "
                    "it: at 0 or below it has no time",
                    f"give a positive number of seconds (e.g. --stop-lead {MIN_STOP_LEAD_S}), "
                    "or leave it out for the plan's training time per rollout plus 5 minutes "
                    f"({STOP_AT_ONCE_LEAD_S} s for an evaluation or run.on_sigterm: stop)",
                    value=lead,
                )
            ],
            title="command-line error",
        )
    return lead


def render_rayjob(
    cfg: RunConfig, plan: Plan, target: Target, args: argparse.Namespace
) -> dict[str, Any]:
    hw = cfg.hardware
    size = pod_size(cfg, plan, args)
    name = job_name(cfg)
    run_dir = f"{args.runs_mount.rstrip('/')}/{name}"
    launch = shlex.join(["python", "launch.py", *_launch_argv(target, cfg)])
    entrypoint = (
        f"cd {shlex.quote(args.workdir)} && {launch} run.dir={shlex.quote(run_dir)} "
        "run.ray_address=auto"
    )
    workers = hw.num_nodes - 1
    lead = pod_stop_lead_s(cfg, plan, args)
    cluster: dict[str, Any] = {
        "rayVersion": version("ray"),
        "headGroupSpec": {
            # The dashboard takes the job submission; it listens on the pod's network only.
            "rayStartParams": {**_start_params(cfg, size), "dashboard-host": "0.0.0.0"},
            "template": _pod(cfg, args, "ray-head", size, lead, run_dir),
        },
        "workerGroupSpecs": [],
    }
    if workers:
        cluster["workerGroupSpecs"].append(
            {
                "groupName": "workers",
                "replicas": workers,
                "minReplicas": workers,
                "maxReplicas": workers,
                "rayStartParams": _start_params(cfg, size),
                "template": _pod(cfg, args, "ray-worker", size, lead, run_dir),
            }
        )
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "rlpost"},
            "annotations": {"rlpost/launch": shlex.join(_launch_argv(target, cfg))},
        },
        "spec": {
            "entrypoint": entrypoint,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 3600,
            "submissionMode": "K8sJobMode",
            "submitterPodTemplate": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "ray-job-submitter",
                            "image": args.image,
                            "env": _container(cfg, args, "submitter")["env"],
                        }
                    ],
                }
            },
            "rayClusterSpec": cluster,
        },
    }


def _write(text: str, out: str | None, what: str) -> None:
    if not out or out == "-":  # `-`: standard output, as for `rlpost new ... --out -`
        print(text, end="" if text.endswith("\n") else "\n")
        return
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"rlpost: wrote {what} to {path}", file=sys.stderr)


def slurm(args: argparse.Namespace) -> int:
    target, cfg, plan = _planned(args)
    text = render_sbatch(cfg, target, args, plan.prediction.train_s, SigtermStop.of(cfg, plan))
    Path(args.run_dir, "logs").mkdir(parents=True, exist_ok=True)  # sbatch opens --output there
    _write(text, args.out, "the sbatch script")
    return 0


def _check_scratch(args: argparse.Namespace) -> None:
    if args.scratch and args.pvc:
        raise UserError(
            [
                Issue(
                    "--scratch",
                    f"says the run directory may go with the pod, and --pvc {args.pvc} keeps "
                    "it on a claim: the two contradict each other",
                    f"drop --scratch to keep the run directory on {args.pvc}, or drop --pvc "
                    "for a one-node run whose directory may go",
                )
            ],
            title="command-line error",
        )


def _check_no_claim(cfg: RunConfig, args: argparse.Namespace) -> None:
    """Without --pvc the run directory lives in each pod's own storage (emptyDir). A training
    run on several nodes cannot work so (its ranks write one checkpoint into one directory);
    on one node, or for an evaluation on any (it writes no checkpoint or export: only the
    head's metrics and every node's logs, each pod's own), what is lost with the pods is
    refused unless --scratch says it may go."""
    nodes = cfg.hardware.num_nodes
    shared = nodes > 1 and cfg.mode != "eval"
    if shared:
        why = (
            f"hardware={cfg.hardware.name} has {nodes} nodes, and their ranks write "
            "checkpoints into one run directory"
        )
    elif cfg.mode == "eval":
        why = (
            "without one the run directory lives in the pods' own storage (emptyDir): an "
            "evaluation writes no checkpoint or export, but its metrics (metrics.jsonl) and "
            "logs go when a pod is rescheduled or restarted, and with the cluster an hour "
            "after the job ends"
        )
    else:
        why = (
            "without one the run directory lives in the head pod's own storage "
            "(emptyDir): its checkpoints, metrics and exports go when the pod is rescheduled "
            "or restarted, and with the cluster an hour after the job ends"
        )
    if shared or not args.scratch:
        fix = "name a PersistentVolumeClaim (ReadWriteMany) every pod mounts: --pvc NAME"
        if not shared:
            fix += ", or --scratch for a run whose directory may go"
        raise UserError([Issue("--pvc", why, fix)], title="command-line error")


def kuberay(args: argparse.Namespace) -> int:
    from rlpost.cli.cluster import parse_env

    args.env_vars = parse_env(
        args.env, os.environ, "the manifest holds its pods' variables in plain text"
    )
    import yaml

    _check_scratch(args)
    target, cfg, plan = _planned(args)
    if not args.pvc:
        _check_no_claim(cfg, args)
    manifest = render_rayjob(cfg, plan, target, args)
    header = (
        "# Generated by `rlpost kuberay` from the plan; regenerate it after a change, do not "
        "edit.\n# Needs a Secret with the Ray token: kubectl create secret generic "
        f"{args.token_secret} --from-literal={TOKEN_SECRET_KEY}=$(openssl rand -hex 32)\n"
        f"# A deleted or preempted RayJob gives the launch {pod_stop_lead_s(cfg, plan, args)} s "
        f"(preStop hooks) before Ray stops: on SIGTERM it {SigtermStop.of(cfg, plan).stops()}.\n"
    )
    if target.config_dir:  # the launch reads it in the pod, not here
        where = PurePosixPath(args.workdir, target.config_dir)
        header += (
            f"# The launch reads --config-dir {target.config_dir} in the pod ({where}): the "
            "image, or a volume mounted there, must hold it.\n"
        )
    _write(header + yaml.safe_dump(manifest, sort_keys=False), args.out, "the RayJob")
    return 0


def _common(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--no-local-checks",
        action="store_true",
        help="as for `rlpost validate`; a job file is written for the cluster's machines, so "
        "its checks never include this one's files, packages or GPUs, with or without it",
    )
    parser.add_argument(
        "--out", "-o", metavar="FILE", help="write here (default, or -: standard output)"
    )


def add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--run-dir", required=True, help="the run directory (on shared storage)")
    parser.add_argument("--partition", help="#SBATCH --partition")
    parser.add_argument("--account", help="#SBATCH --account")
    parser.add_argument("--time", help="#SBATCH --time, e.g. 24:00:00")
    parser.add_argument(
        "--stop-lead",
        type=int,
        metavar="SECONDS",
        help="SIGTERM to the launch this long before the time limit, so that it saves and "
        "stops (default: the plan's training time per rollout plus 5 minutes, 5 at least; "
        f"{STOP_AT_ONCE_LEAD_S} s for an evaluation or a run with run.on_sigterm: stop, "
        "which save nothing)",
    )
    parser.add_argument("--python", help="the Python of rlpost's environment on the nodes")
    parser.add_argument("--rlpost-dir", help="where launch.py is on the nodes")


def add_kuberay_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--image", required=True, help="a container image with rlpost installed")
    parser.add_argument("--pvc", default="", help="a PersistentVolumeClaim for the run directory")
    parser.add_argument("--runs-mount", default="/runs", help="where the claim is mounted")
    parser.add_argument(
        "--scratch",
        action="store_true",
        help="no --pvc (one node, or an evaluation on any): the run directory in the pods' "
        "own storage, gone with them",
    )
    parser.add_argument(
        "--pod-cpus",
        type=int,
        metavar="N",
        help=f"CPUs each Ray pod asks for (default: {POD_SHARE:.0%}% of the profile's node: a "
        "node's allocatable is below its capacity)",
    )
    parser.add_argument(
        "--pod-memory-gib",
        type=int,
        metavar="GIB",
        help=f"memory each Ray pod asks for (default: {POD_SHARE:.0%}% of the profile's node)",
    )
    parser.add_argument(
        "--stop-lead",
        type=int,
        metavar="SECONDS",
        help="how long a deleted or preempted head pod gives the launch to save and stop "
        "before Kubernetes stops Ray (its terminationGracePeriodSeconds, with Ray's stop); "
        "default: the plan's training time per rollout plus 5 minutes, 5 at least; "
        f"{STOP_AT_ONCE_LEAD_S} s for an evaluation or a run with run.on_sigterm: stop, "
        "which save nothing",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="a variable of every Ray pod, and so of the run's actors (NCCL_IB_HCA, HF_HOME, "
        "...; NAME alone: this shell's value); repeat for each",
    )
    parser.add_argument("--workdir", default="/workspace/rlpost", help="launch.py's folder")
    parser.add_argument(
        "--token-secret", default="rlpost-ray-token", help="the Secret with the Ray token"
    )
