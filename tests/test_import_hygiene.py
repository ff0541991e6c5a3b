"""Planning stays light: composing, validating and planning import no ML framework.

Each check runs in a fresh interpreter, because this test process itself may already hold
torch (other tests' fixtures import it).
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("torch", "ray", "transformers", "megatron", "sglang", "numpy", "pyarrow")
PLAN_ARGS = ("model=glm4.5-355b-a32b", "recipe=grpo_dapo", "hardware=h100x64")

PLAN_SCRIPT = f"""
import importlib.util, json, sys
import rlpost.config, rlpost.plan, rlpost.schema, rlpost.errors
from rlpost.plan import build_plan, render_plan, render_slime_args
if importlib.util.find_spec("rlpost.config.loader"):
    import rlpost.config.loader
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from rlpost.config.resolvers import register_resolvers
register_resolvers()
with initialize_config_dir(config_dir={str(REPO / "conf")!r}, version_base=None):
    cfg = compose("config", overrides={list(PLAN_ARGS)!r})
run = rlpost.schema.RunConfig.model_validate(OmegaConf.to_container(cfg, resolve=True))
plan = build_plan(run)
render_plan(plan, "table"); render_plan(plan, "json"); render_slime_args(run, plan)
from rlpost.plan import plan_config
from rlpost.schema.layout import LayoutConfig
auto = run.model_copy(update={{"layout": LayoutConfig(name="auto", search=True)}})
render_plan(plan_config(auto)[1], "table")  # layout=auto searches with the same light imports
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {FORBIDDEN!r})))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def test_plan_path_imports_no_framework() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PLAN_SCRIPT],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def _imports_of(*python_args: str) -> set[str]:
    """The modules `python -X importtime <python_args>` imports (it must exit 0)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *python_args],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return _imported_modules(result.stderr)


def _imported_modules(importtime_stderr: str) -> set[str]:
    """Module names from `python -X importtime` lines ('import time: self | cum | name')."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.mark.skipif(not (REPO / "launch.py").exists(), reason="launch.py not present")
def test_launch_mode_plan_imports_no_framework() -> None:
    modules = _imports_of("launch.py", *PLAN_ARGS, "mode=plan")
    assert "rlpost.plan" in modules
    heavy = sorted(m for m in modules if m.split(".")[0] in FORBIDDEN)
    assert heavy == []


def test_an_engine_server_imports_neither_the_plan_nor_the_schema() -> None:
    """Each CPU engine is a process of its own, started while the train ranks start on the
    same cores: what its module imports is start-up time of every launch. It needs torch and
    transformers; the plan and the config schema (pydantic) it does not."""
    modules = _imports_of("-c", "import rlpost.backends.cpu_engine.server")
    assert {"torch", "transformers", "rlpost.backends.sglang.launch"} <= modules
    assert sorted(m for m in modules if m.startswith(("rlpost.plan", "rlpost.schema"))) == []


def test_the_preflight_imports_no_framework() -> None:
    """`rlpost validate` reads every prompt file with the preflight: pyarrow is imported
    only where a parquet file is read, never for planning or for a jsonl file. Every module
    of the package is imported, the ones to come as well."""
    preflight = sorted(
        f"rlpost.preflight.{path.stem}" for path in (REPO / "rlpost" / "preflight").glob("*.py")
    )
    modules = _imports_of("-c", f"import {', '.join(preflight)}, rlpost.data.prompts")
    assert {"rlpost.preflight.machine", "rlpost.data.files"} <= modules
    assert sorted(m for m in modules if m.split(".")[0] in FORBIDDEN) == []


def _rlpost_imports(path: Path) -> list[str]:
    """The rlpost modules a file imports, anywhere in it (a function's own imports too)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "rlpost":
            names += [f"rlpost.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return [name for name in names if name.startswith("rlpost.")]


def test_the_plan_imports_neither_the_runtime_nor_the_preflight() -> None:
    """The plan is made anywhere, with no cluster and no run directory: what reads this
    machine, a cluster or a run (rlpost.preflight, rlpost.runtime) sits above it, never in it."""
    above = ("rlpost.runtime", "rlpost.preflight")
    reached = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted((REPO / "rlpost" / "plan").rglob("*.py"))
        for name in _rlpost_imports(path)
        if ".".join(name.split(".")[:2]) in above
    ]
    assert reached == []


def _module_files() -> dict[str, Path]:
    """Every module of rlpost by its dotted name (a package by its __init__.py)."""
    modules = {}
    for path in sorted((REPO / "rlpost").rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """Each module's rlpost imports (the module imported, the line that imports it): at the
    top, inside functions and under TYPE_CHECKING alike; `from package import name` imports
    the submodule `name` where there is one, else the package."""

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                names = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for name in names:
                target = known(name) if name.split(".")[0] == "rlpost" else None
                if target is not None and target != module:
                    targets.setdefault(target, node.lineno)
        graph[module] = targets
    return graph


def _circles(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(graph[step])))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(frozenset(group))
    return groups


def _cycle(
    graph: dict[str, dict[str, int]], group: frozenset[str], modules: dict[str, Path]
) -> str:
    """One circle through `group`'s first module, each import with its file and line."""
    start = min(group)
    came_from: dict[str, str] = {}
    queue = [start]
    while queue:  # breadth first: the shortest way back to `start`
        node = queue.pop(0)
        for target in sorted(graph[node]):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                steps = [*reversed(path), start]
                return "; ".join(
                    f"{a} imports {b} ({modules[a].relative_to(REPO)}:{graph[a][b]})"
                    for a, b in itertools.pairwise(steps)
                )
            if target in group and target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"no circle through {start}")


def test_no_module_of_rlpost_imports_itself_back() -> None:
    """Two modules that import each other (directly or along a chain, at the top, inside a
    function or under TYPE_CHECKING) cannot be read, tested or moved apart: a name both need
    lives in a module below both. Each circle is named import by import."""
    modules = _module_files()
    graph = _import_graph(modules)
    circles = [_cycle(graph, group, modules) for group in _circles(graph)]
    assert circles == [], "import circle(s):\n" + "\n".join(circles)
