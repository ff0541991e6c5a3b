"""`rlpost cluster`: bring a Ray cluster up from an MPI hostfile, show it, take it down.

    rlpost cluster up --hostfile hosts        # lines `10.0.0.1 slots=8`, one per node
    rlpost cluster status
    rlpost cluster down
    rlpost cluster wait --address HEAD:PORT --node-address IP --nodes N   # in scheduler scripts

`up` starts the head on this machine (the first hostfile address that is this machine's),
then each other node as a worker over ssh with its own `ray start` (its node address, its GPU
count, the head's address), all at once, and waits until every node has registered. Token
authentication stays on: the head's token (~/.ray/auth_token, made if missing) reaches each
worker through ssh's standard input into a file only its owner reads, never a command line.
The ssh command is `--ssh` (default `ssh -o BatchMode=yes`); rlpost appends the host and the
remote command, as ssh takes them. `--env NAME=VALUE` gives every node's Ray (and so the
run's actors there) a variable: a worker inherits nothing from the shell `up` ran in. What
`up` started is kept in a state file for `status` and `down`.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import secrets
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlpost.errors import Issue, UserError

HELP = "bring a Ray cluster up from a hostfile (over ssh), show it, or take it down"
DEFAULT_SSH = "ssh -o BatchMode=yes"
DEFAULT_PORT = 6379
STATE_FILE = Path.home() / ".cache" / "rlpost" / "cluster.json"
TOKEN_FILE = Path.home() / ".ray" / "auth_token"  # where Ray and its drivers look first
COMMAND_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Host:
    """One hostfile line: a node's address and its slots (GPUs, or CPUs with --kind cpu)."""

    address: str
    slots: int


def parse_hostfile(text: str, path: str) -> list[Host]:
    """MPI hostfile lines `ADDRESS slots=N` (blank lines and # comments skipped)."""
    hosts: list[Host] = []
    issues: list[Issue] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        words = line.split()
        # `slots=N` (MPI), or `slot=N` as seed hostfiles write it
        slots = [w.split("=", 1)[1] for w in words[1:] if w.startswith(("slots=", "slot="))]
        try:
            ipaddress.ip_address(words[0])
        except ValueError:
            issues.append(_name_issue(where, words, raw))
            continue
        if len(slots) != 1 or not slots[0].isdigit() or int(slots[0]) < 1:
            issues.append(
                Issue(
                    where,
                    "each line needs its node's GPU count as slots=N (N >= 1)",
                    f"write e.g. `{words[0]} slots=8`",
                    raw,
                )
            )
            continue
        if any(h.address == words[0] for h in hosts):
            issues.append(Issue(where, f"{words[0]} is listed twice", "list each node once", raw))
            continue
        hosts.append(Host(words[0], int(slots[0])))
    if not hosts and not issues:
        issues.append(Issue(path, "no host in the hostfile", "one line per node: IP slots=N"))
    if issues:
        raise UserError(issues, title="hostfile error")
    return hosts


def _name_issue(where: str, words: Sequence[str], raw: str) -> Issue:
    """A host name where the node's IP goes, with the IP it resolves to here, if any."""
    name, rest = words[0], " ".join(words[1:]) or "slots=N"
    try:
        found = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        found = []
    fix = (
        f"write its IP: `{found[0][4][0]} {rest}` ({name} resolves to it here)"
        if found
        else f"write its IP: `IP {rest}` (`getent hosts {name}` prints it where the name resolves)"
    )
    return Issue(
        where,
        f"{name!r} is not an IP address: each node's Ray is started with --node-ip-address "
        "(an IP) and the nodes that register with the head are matched to the hostfile by it",
        fix,
        raw,
    )


@dataclass(frozen=True)
class ClusterState:
    """What `up` started, for `status` and `down`."""

    head: str
    port: int
    workers: list[str]
    ssh: str
    ray: str
    slots: dict[str, int]
    kind: str
    env: dict[str, str] = field(default_factory=dict)  # --env: every node's Ray and actors

    @property
    def address(self) -> str:
        return f"{self.head}:{self.port}"


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def parse_env(
    given: Sequence[str],
    environ: Mapping[str, str],
    shown: str = "a worker's variables are on its `ray start` command line, which every user "
    "of the node can read",
) -> dict[str, str]:
    """`--env NAME=VALUE` (or `--env NAME`: this shell's value) -> the variables every node's
    Ray starts with. A worker's actors inherit its `ray start`'s environment, never the
    launch's: NCCL_*, HF_HOME and their kin exported here reach the head's node alone."""
    env: dict[str, str] = {}
    issues = []
    for item in given:
        name, has_value, value = item.partition("=")
        if not ENV_NAME.fullmatch(name):
            why, fix = "is not NAME=VALUE with a variable's name", "write e.g. NCCL_IB_HCA=mlx5"
        elif any(word in name.upper() for word in SECRET_WORDS):
            why = f"looks like a secret, and {shown}"
            fix = "set it in the nodes' own environment (or a file only you read)"
        elif not has_value and name not in environ:
            why, fix = "takes this shell's value, and it is not set here", f"give {name}=VALUE"
        else:
            env[name] = value if has_value else environ[name]
            continue
        issues.append(Issue("--env", why, fix, item))
    if issues:
        raise UserError(issues, title="command-line error")
    return env


def _ray_bin() -> str:
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else "ray"


def _resources(kind: str, slots: int) -> list[str]:
    if kind == "gpu":
        return [f"--num-gpus={slots}"]
    return [f"--num-cpus={slots}", "--num-gpus=0"]


def _is_local(address: str) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


def choose_head(hosts: Sequence[Host], path: str) -> str:
    """The head is this machine: the first hostfile address that is one of its own."""
    for host in hosts:
        if _is_local(host.address):
            return host.address
    raise UserError(
        [
            Issue(
                "--hostfile",
                "the head runs where `rlpost cluster up` runs, and none of the hostfile's "
                f"addresses ({', '.join(h.address for h in hosts)}) is this machine's",
                "run it on the node that should be the head (one of those addresses), or add "
                "this machine's line",
                path,
            )
        ],
        title="cluster error",
    )


def ensure_token(path: Path = TOKEN_FILE) -> str:
    """The cluster's token: Ray's default file, made (readable by its owner only) if missing."""
    if path.exists() and path.read_text(encoding="utf-8").strip():
        return path.read_text(encoding="utf-8").strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token)
    return token


def _token_env() -> dict[str, str]:
    return {**os.environ, "RAY_AUTH_MODE": "token"}


def _failed(what: str, output: str, fix: str) -> UserError:
    tail = "\n      ".join(output.strip().splitlines()[-8:]) or "(no output)"
    return UserError([Issue("cluster", f"{what}:\n      {tail}", fix)], title="cluster error")


def start_head(state: ClusterState, dashboard: bool) -> None:
    cmd = [
        state.ray,
        "start",
        "--head",
        f"--node-ip-address={state.head}",
        f"--port={state.port}",
        *_resources(state.kind, state.slots[state.head]),
        "--disable-usage-stats",
    ]
    cmd += ["--dashboard-host=127.0.0.1"] if dashboard else ["--include-dashboard=false"]
    done = subprocess.run(
        cmd,
        env={**_token_env(), **state.env},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise _failed(
            f"the head did not start ({shlex.join(cmd)})",
            done.stdout + done.stderr,
            "read Ray's message above; `ray stop` ends a Ray left running on this machine",
        )


GPU_SHORT_EXIT = 3  # a node with fewer GPUs than its hostfile line's slots


def gpu_check(state: ClusterState, address: str) -> str:
    """Shell that ends with GPU_SHORT_EXIT, saying why, where nvidia-smi lists fewer GPUs
    than the node's slots: `ray start --num-gpus=N` takes N as given, and Ray would place
    ranks and engines on GPUs the node does not have (CUDA fails on them mid-start)."""
    if state.kind != "gpu":
        return ""
    slots = state.slots[address]
    return (
        'n=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU "); '
        f'[ "$n" -ge {slots} ] || {{ echo "{address}: nvidia-smi lists $n GPU(s) there, and '
        f'the hostfile gives it slots={slots}"; exit {GPU_SHORT_EXIT}; }}; '
    )


def _gpu_issues(lines: Sequence[str]) -> UserError:
    return UserError(
        [
            Issue(
                "--hostfile",
                line,
                "give each node its GPU count as slots (fewer leaves the others unused), or "
                "--kind cpu for a CPU profile's slots; `rlpost cluster down` stops what did start",
            )
            for line in lines
        ],
        title="hostfile error",
    )


def check_head_gpus(state: ClusterState) -> None:
    """The head's GPUs against its slots, before its Ray starts (gpu_check, run here)."""
    check = gpu_check(state, state.head)
    if not check:
        return
    done = subprocess.run(["sh", "-c", check], capture_output=True, text=True, check=False)
    if done.returncode == GPU_SHORT_EXIT:
        raise _gpu_issues([done.stdout.strip()])


def worker_command(state: ClusterState, address: str) -> str:
    """The remote command of one worker: the token from standard input into a file only the
    user reads, then `ray start` against the head with that token."""
    token_file = f"$HOME/.ray/rlpost-token-{state.head}-{state.port}"
    start = [
        state.ray,
        "start",
        f"--address={state.address}",
        f"--node-ip-address={address}",
        *_resources(state.kind, state.slots[address]),
        "--disable-usage-stats",
    ]
    env = "".join(f"{name}={shlex.quote(value)} " for name, value in state.env.items())
    return (
        f"{gpu_check(state, address)}"
        f'umask 077 && mkdir -p "$HOME/.ray" && cat > "{token_file}" && '
        f'RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="{token_file}" {env}{shlex.join(start)}'
    )


def _over_ssh(ssh: str, host: str, remote: str, stdin: str | None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*shlex.split(ssh), host, remote],
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def start_workers(state: ClusterState, token: str) -> None:
    running = {
        host: _over_ssh(state.ssh, host, worker_command(state, host), token)
        for host in state.workers
    }
    failed, short = [], []
    for host, proc in running.items():
        try:
            output, _ = proc.communicate(token, timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            output = f"no answer within {COMMAND_TIMEOUT_S:.0f} s"
        last = output.strip().splitlines()[-1] if output.strip() else ""
        if proc.returncode == GPU_SHORT_EXIT and last.startswith(f"{host}: nvidia-smi lists"):
            short.append(last)
        elif proc.returncode != 0:
            failed.append(f"{host}: {last}")
    if short:
        raise _gpu_issues(short)
    if failed:
        raise _failed(
            f"{len(failed)} worker(s) did not start",
            "\n".join(failed),
            "check that `ssh HOST` works without a password (BatchMode), that rlpost's Python "
            f"environment is at the same path there ({state.ray}), and that the head's port "
            f"{state.port} is reachable; `rlpost cluster down` stops what did start",
        )


@dataclass(frozen=True)
class NodeRow:
    address: str
    alive: bool
    gpus: float
    cpus: float


def read_nodes(address: str, node_address: str) -> list[NodeRow]:
    """The cluster's nodes as its GCS reports them (no driver joins: milliseconds).
    `node_address` is this machine's address in the cluster (unused by the GCS read)."""
    from rlpost.runtime.gcs import read_gcs_nodes

    return [NodeRow(n.address, n.alive, n.gpus, n.cpus) for n in read_gcs_nodes(address)]


def poll_nodes(
    address: str, node_address: str, done: Callable[[list[NodeRow]], bool], timeout_s: float
) -> tuple[bool, list[NodeRow]]:
    """Read the cluster's nodes every second until `done(nodes)` or the timeout; a head not
    answering yet counts as no node."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            rows = read_nodes(address, node_address)
        except (ConnectionError, RuntimeError):
            rows = []
        if done(rows) or time.monotonic() > deadline:
            return done(rows), rows
        time.sleep(1.0)


def _alive(rows: Sequence[NodeRow]) -> set[str]:
    return {r.address for r in rows if r.alive}


def wait_for_nodes(state: ClusterState, timeout_s: float) -> list[NodeRow]:
    expected = {state.head, *state.workers}
    ok, rows = poll_nodes(state.address, state.head, lambda r: expected <= _alive(r), timeout_s)
    if not ok:
        missing = ", ".join(sorted(expected - _alive(rows)))
        raise _failed(
            f"after {timeout_s:.0f} s these nodes have not registered with the head: {missing}",
            "",
            "look at /tmp/ray/session_latest/logs/raylet.out on those nodes",
        )
    return rows


def render_nodes(state: ClusterState, rows: Sequence[NodeRow]) -> str:
    from rlpost.plan.table import render_table

    unit = "GPUs" if state.kind == "gpu" else "CPUs"
    table = [
        [
            r.address,
            "head" if r.address == state.head else "worker",
            "alive" if r.alive else "dead",
            int(r.gpus if state.kind == "gpu" else r.cpus),
        ]
        for r in sorted(rows, key=lambda r: (r.address != state.head, r.address))
    ]
    alive = sum(1 for r in rows if r.alive)
    return render_table(
        ["node", "role", "state", unit],
        table,
        f"Ray cluster at {state.address}: {alive} node(s) alive",
    ) + (
        f"\njoin it from the head: python launch.py ... run.ray_address={state.address} "
        f"run.node_address={state.head}"
    )


def _save(state: ClusterState, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(state), indent=2) + "\n", encoding="utf-8")


def _load(path: Path) -> ClusterState:
    try:
        return ClusterState(**json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise UserError(
            [
                Issue(
                    "--state",
                    f"no cluster state at {path}: `rlpost cluster up` writes it",
                    "bring a cluster up first, or pass the --state file `up` wrote",
                    str(path),
                )
            ],
            title="cluster error",
        ) from None


def up(args: argparse.Namespace) -> int:
    path = Path(args.hostfile)
    try:
        hosts = parse_hostfile(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise UserError(
            [
                Issue(
                    "--hostfile",
                    f"cannot read it ({exc.strerror})",
                    "give a readable file",
                    str(path),
                )
            ],
            title="hostfile error",
        ) from None
    head = choose_head(hosts, str(path))
    state = ClusterState(
        head=head,
        port=args.port,
        workers=[h.address for h in hosts if h.address != head],
        ssh=args.ssh,
        ray=args.ray or _ray_bin(),
        slots={h.address: h.slots for h in hosts},
        kind=args.kind,
        env=parse_env(args.env, os.environ),
    )
    check_head_gpus(state)
    token = ensure_token()
    print(f"rlpost: starting the head at {state.address}", flush=True)
    start_head(state, args.dashboard)
    _save(state, Path(args.state))
    if state.workers:
        print(f"rlpost: starting {len(state.workers)} worker(s) over `{state.ssh}`", flush=True)
        start_workers(state, token)
    rows = wait_for_nodes(state, args.timeout)
    print(render_nodes(state, rows))
    return 0


def status(args: argparse.Namespace) -> int:
    state = _load(Path(args.state))
    rows = read_nodes(state.address, state.head)
    print(render_nodes(state, rows))
    return 0 if {state.head, *state.workers} <= _alive(rows) else 1


def stop_command(python: str, state: ClusterState) -> list[str]:
    """Stops the cluster's processes on the machine it runs on, and no other Ray's (`ray
    stop` would end them all: see rlpost.cli.ray_processes); the script on standard input."""
    return [python, "-", state.address]


def _python_beside(ray: str) -> str:
    """The Python of the environment `ray` is in (workers: the same path as here)."""
    return str(Path(ray).parent / "python") if os.sep in ray else "python3"


def down(args: argparse.Namespace) -> int:
    from rlpost.cli import ray_processes

    state = _load(Path(args.state))
    script = Path(ray_processes.__file__).read_text(encoding="utf-8")
    remote = shlex.join(stop_command(_python_beside(state.ray), state))
    for host in state.workers:
        proc = _over_ssh(state.ssh, host, remote, script)
        output, _ = proc.communicate(script, timeout=COMMAND_TIMEOUT_S)
        if proc.returncode != 0:
            print(
                f"rlpost: warning: {host}: stopping Ray failed: {output.strip()}", file=sys.stderr
            )
    subprocess.run(
        stop_command(sys.executable, state), input=script, text=True, capture_output=True,
        timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip
    Path(args.state).unlink(missing_ok=True)
    print(f"rlpost: the cluster at {state.address} is down ({1 + len(state.workers)} node(s))")
    return 0


def wait(args: argparse.Namespace) -> int:
    """Until `--nodes` nodes are alive in the cluster at --address (a scheduler's script)."""
    ok, rows = poll_nodes(
        args.address, args.node_address, lambda r: len(_alive(r)) >= args.nodes, args.timeout
    )
    alive = len(_alive(rows))
    if ok:
        print(f"rlpost: {alive} node(s) alive in the cluster at {args.address}")
        return 0
    print(
        f"rlpost: after {args.timeout:.0f} s, {alive} of {args.nodes} node(s) alive in the "
        f"cluster at {args.address}",
        file=sys.stderr,
    )
    return 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="{up,status,down,wait}")
    state_help = f"where `up` records the cluster (default {STATE_FILE})"
    p = actions.add_parser("up", help="start the head here and the workers over ssh")
    p.add_argument("--hostfile", required=True, metavar="FILE", help="lines `IP slots=N`")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="the head's port")
    p.add_argument(
        "--kind",
        choices=("gpu", "cpu"),
        default="gpu",
        help="slots are GPUs (default) or CPUs (a CPU hardware profile's device slots)",
    )
    p.add_argument("--ssh", default=DEFAULT_SSH, help=f"the ssh command (default: {DEFAULT_SSH})")
    p.add_argument("--ray", help="the ray command on every node (default: this environment's)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="a variable every node's Ray and the run's actors there start with (NCCL_IB_HCA, "
        "HF_HOME, ...; NAME alone: this shell's value); repeat for each",
    )
    p.add_argument("--timeout", type=float, default=COMMAND_TIMEOUT_S, help="seconds to wait")
    p.add_argument(
        "--dashboard",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Ray's dashboard on the head's loopback (ray job submit needs it)",
    )
    p.add_argument("--state", default=str(STATE_FILE), help=state_help)
    p.set_defaults(handler=up)
    w = actions.add_parser("wait", help="wait until N nodes are alive (for scheduler scripts)")
    w.add_argument("--address", required=True, help="the head's host:port")
    w.add_argument("--node-address", required=True, help="this node's address in the cluster")
    w.add_argument("--nodes", type=int, required=True, help="how many nodes to wait for")
    w.add_argument("--timeout", type=float, default=600.0, help="seconds to wait")
    w.set_defaults(handler=wait)
    for name, handler, text in (
        ("status", status, "print the nodes and whether each is alive (exit 1 if one is not)"),
        ("down", down, "stop every node `up` started"),
    ):
        sub = actions.add_parser(name, help=text)
        sub.add_argument("--state", default=str(STATE_FILE), help=state_help)
        sub.set_defaults(handler=handler)


def run(args: argparse.Namespace) -> int:
    return int(args.handler(args))
