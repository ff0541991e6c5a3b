"""The test scheduler of tests/conftest.py (RealLoopFirst): which scope of the work queue a
worker is handed next, on synthetic queues (no workers are started)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REAL = "tests/integration/"


class XdistOptions:
    """The two options the scheduler reads of pytest's config: --dist and --tx (three
    workers)."""

    def getvalue(self, name: str) -> Any:
        return {"dist": "load", "tx": ["3*popen"]}[name]


@pytest.fixture
def conftest(pytestconfig: pytest.Config) -> ModuleType:
    path = Path(__file__).with_name("conftest.py")
    plugins = pytestconfig.pluginmanager.get_plugins()
    found = [p for p in plugins if getattr(p, "__file__", None) == str(path)]
    if not found:
        pytest.skip("tests/conftest.py is not loaded as a plugin")
    module: ModuleType = found[0]
    return module


def scheduler(conftest: ModuleType, queue: list[str], held: list[dict[str, bool]]) -> Any:
    """A RealLoopFirst over `queue` (scopes, in order) whose workers hold `held` (each
    worker's assigned scopes and whether each of their tests has finished)."""
    sched = conftest.pytest_xdist_make_scheduler(XdistOptions(), None)
    assert sched is not None
    sched.workqueue = OrderedDict((scope, {f"{scope}::t": False}) for scope in queue)
    sched.assigned_work = {
        object(): {scope: {scope: done} for scope, done in work.items()} for work in held
    }
    return sched


def unit(name: str) -> str:
    return f"tests/unit/{name}"


def real(name: str) -> str:
    return f"{REAL}{name}"


NONE: list[dict[str, bool]] = [{}, {}, {}]
CASES = [
    # (queue, what each of the three workers holds, the worker asking, the scope it gets)
    # the first worker takes the first real-loop scope wherever it is in the queue
    ([unit("a"), unit("b"), real("x"), unit("c"), real("y")], NONE, 0, real("x")),
    ([real("x"), unit("a"), real("y")], NONE, 0, real("x")),
    # ... and the first other one when none is left
    ([unit("a"), unit("b")], NONE, 0, unit("a")),
    # the others take the first scope that is not the real loop's
    ([real("x"), real("y"), unit("a"), real("z"), unit("b")], NONE, 1, unit("a")),
    ([unit("a"), real("x")], NONE, 2, unit("a")),
    # ... and, once only real-loop scopes are left, the first of them while fewer than two
    # real-loop scopes run
    ([real("x"), real("y")], NONE, 1, real("x")),
    ([real("x"), real("y")], [{real("w"): False}, {}, {}], 1, real("x")),
    # a real-loop scope whose tests have all finished no longer runs
    ([real("x")], [{real("v"): True}, {}, {real("w"): True}], 1, real("x")),
    # two running: a worker without one waits, a worker running one takes the next
    ([real("x"), real("y")], [{real("v"): False}, {}, {real("w"): False}], 1, None),
    ([real("x"), real("y")], [{real("v"): False}, {real("w"): False}, {}], 1, real("x")),
    (
        [real("x")],
        [{real("v"): False, unit("a"): False}, {unit("b"): False}, {real("w"): False}],
        1,
        None,
    ),
]


@pytest.mark.parametrize(("queue", "held", "asking", "chosen"), CASES)
def test_a_worker_is_handed_the_scope_the_rule_picks(
    conftest: ModuleType,
    queue: list[str],
    held: list[dict[str, bool]],
    asking: int,
    chosen: str | None,
) -> None:
    sched = scheduler(conftest, queue, held)
    assert sched._next_scope(sched.nodes[asking]) == chosen
    assert list(sched.workqueue) == queue  # choosing takes nothing off the queue


class CountingQueue(OrderedDict[str, dict[str, bool]]):
    """A work queue that counts the scopes read from it."""

    read = 0

    def __iter__(self) -> Iterator[str]:
        for scope in super().__iter__():
            self.read += 1
            yield scope


def test_a_choice_reads_the_queue_only_up_to_its_first_match(conftest: ModuleType) -> None:
    """A hand-out looks at the queue's scopes up to the first of the kind the worker takes
    (and at the queue's first), not the whole queue: the queue holds every scope of the
    suite, and a worker is handed one after each of its tests."""
    queue = [unit("a"), real("x")] + [unit(str(i)) for i in range(100)]
    for asking, chosen, reads in ((0, real("x"), 3), (1, unit("a"), 2)):
        sched = scheduler(conftest, queue, NONE)
        sched.workqueue = CountingQueue(sched.workqueue)
        assert sched._next_scope(sched.nodes[asking]) == chosen
        assert sched.workqueue.read == reads


def test_every_test_that_takes_a_shared_launch_is_in_its_unit(conftest: ModuleType) -> None:
    """A test that takes a module's shared launch (test_resume's `reference`) but is not
    listed with it runs as a unit of its own, and its worker starts that launch again (the
    fixture is torn down when the worker moves to another module): each is listed."""
    import ast

    root = Path(__file__).resolve().parents[1]
    shared: dict[str, str] = conftest.SHARED_LAUNCH
    by_test = {p: f for p, f in shared.items() if "::" in p}
    for module in sorted({p.split("::")[0] for p in by_test}):
        tree = ast.parse((root / module).read_text())
        fixtures = {f for p, f in by_test.items() if p.startswith(module)}
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            takes = fixtures & {a.arg for a in node.args.args}
            for fixture in takes:
                listed = [p for p, f in by_test.items() if f == fixture]
                assert any(f"{module}::{node.name}".startswith(p) for p in listed), (
                    f"{module}::{node.name} takes `{fixture}`: list it in SHARED_LAUNCH"
                )
