"""A training launch whose plan does not fit in memory stops before anything starts."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rlpost.plan import build_plan
from rlpost.plan.fit import memory_issues, timeout_issues
from rlpost.schema import RunConfig

REPO = Path(__file__).resolve().parents[2]
ComposeRun = Callable[..., RunConfig]


def test_the_default_and_the_seed_runs_fit(compose_run: ComposeRun) -> None:
    assert memory_issues(build_plan(compose_run())) == []
    seed = compose_run("model=glm4.5-355b-a32b", "recipe=grpo_dapo", "hardware=h100x64")
    assert memory_issues(build_plan(seed)) == []


def test_each_part_that_does_not_fit_is_an_issue(compose_run: ComposeRun) -> None:
    # the KL logged every rollout keeps the reference weights in host memory
    plan = build_plan(
        compose_run("model=qwen3-8b", "hardware=cpu", "recipe.algo.kl_metric_interval=1")
    )
    issues = memory_issues(plan)
    assert [i.key for i in issues] == ["layout.train", "layout.rollout", "hardware.host_memory_gib"]
    assert all("plan.memory_check=warn" in i.fix for i in issues)
    # a KL that weighs nothing and is never logged: no reference weights anywhere
    unlogged = build_plan(compose_run("model=qwen3-8b", "hardware=cpu"))
    assert unlogged.memory.host.reference_weights_gib == 0.0
    assert [i.key for i in memory_issues(unlogged)] == ["layout.train", "layout.rollout"]


def test_the_launch_refuses_it_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    command = [sys.executable, "launch.py", "model=qwen3-8b", f"run.dir={tmp_path / 'run'}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "training needs" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "ckpt").exists()


def test_validate_runs_the_same_gate_for_a_training_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rlpost.cli.main import main

    with pytest.raises(SystemExit) as caught:
        main(["validate", "--no-local-checks", "model=qwen3-8b"])
    assert caught.value.code == 2 and "memory problems" in capsys.readouterr().err
    warned = ["validate", "--no-local-checks", "model=qwen3-8b", "plan.memory_check=warn"]
    assert main(warned) in (0, None)


def test_a_train_call_predicted_near_its_timeout_is_refused(
    compose_run: ComposeRun, capsys: pytest.CaptureFixture[str]
) -> None:
    """trainer.collective_timeout_s holds a rollout's whole training: the cost model's figure
    needs twice that room (qwen3-4b on one H200: about 261 s)."""
    from rlpost.cli.main import main

    one_gpu = ("model=qwen3-4b", "recipe=grpo_dapo", "hardware=h200x1")
    plan = build_plan(compose_run(*one_gpu))
    assert 200 < plan.prediction.train_s < 300
    assert timeout_issues(compose_run(*one_gpu), plan) == []  # the default 600 s
    tight = compose_run(*one_gpu, "trainer.collective_timeout_s=400")
    (issue,) = timeout_issues(tight, build_plan(tight))
    assert (issue.key, issue.value) == ("trainer.collective_timeout_s", 400)
    assert f"predicted at {plan.prediction.train_s:.0f} s" in issue.message
    assert "raise trainer.collective_timeout_s to 840 or more" in issue.fix
    cpu = compose_run("trainer.collective_timeout_s=1")  # nominal CPU figures: no verdict
    assert timeout_issues(cpu, build_plan(cpu)) == []
    with pytest.raises(SystemExit) as caught:
        main(["validate", "--no-local-checks", *one_gpu, "trainer.collective_timeout_s=400"])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and "launch problem" in err and "collective_timeout_s" in err
