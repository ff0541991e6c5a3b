"""load_run_config on hand-built configs: every problem becomes one located Issue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from rlpost.config.loader import load_run_config
from rlpost.config.sources import SourceMap
from rlpost.errors import Location, UserError
from rlpost.schema import Section

CONF = Path(__file__).resolve().parents[3] / "conf"


def shipped(group: str, name: str) -> dict[str, Any]:
    data = yaml.safe_load((CONF / group / f"{name}.yaml").read_text())
    data.pop("defaults", None)
    return data


def run_dict(**changes: Any) -> dict[str, Any]:
    data = {
        "mode": "plan",
        "model": shipped("model", "qwen3-4b"),
        "recipe": shipped("recipe", "grpo_dapo"),
        "hardware": shipped("hardware", "h100x8"),
    }
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return data


SOURCES = SourceMap(
    {
        "recipe.rollout.temperature": Location(file="conf/recipe/grpo_dapo.yaml", line=20),
        "model": Location(file="conf/model/qwen3-4b.yaml", line=1),
        "model.ref_load": Location(override="model.ref_load=${model.nope}"),
    }
)


def errors_of(data: dict[str, Any]) -> UserError:
    with pytest.raises(UserError) as caught:
        load_run_config(OmegaConf.create(data), SOURCES)
    return caught.value


def test_a_valid_config_loads() -> None:
    run = load_run_config(OmegaConf.create(run_dict()), SOURCES)
    assert run.model.name == "qwen3-4b" and run.recipe.rollout.batch_size == 32


def test_issues_carry_the_location_of_their_key() -> None:
    error = errors_of(run_dict(recipe__rollout__temperature=-1.0, trainer__backend="jax"))
    by_key = {issue.key: issue for issue in error.issues}
    assert set(by_key) == {"recipe.rollout.temperature", "trainer.backend"}
    assert str(by_key["recipe.rollout.temperature"].location) == "conf/recipe/grpo_dapo.yaml:20"
    assert by_key["recipe.rollout.temperature"].value == -1.0
    assert str(by_key["trainer.backend"].location) == "default"
    assert "one of 'auto', 'torch', 'megatron'" in by_key["trainer.backend"].fix


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_float_that_is_not_finite_is_refused(value: float) -> None:
    error = errors_of(run_dict(recipe__rollout__temperature=value, recipe__optim__lr=value))
    by_key = {issue.key: issue for issue in error.issues}
    assert set(by_key) == {"recipe.rollout.temperature", "recipe.optim.lr"}
    assert f"must be a finite number; got {value!r}" in by_key["recipe.optim.lr"].message
    assert by_key["recipe.optim.lr"].fix == "set it to a finite number > 0"
    assert by_key["recipe.rollout.temperature"].fix == "set it to a finite number"


def test_every_section_refuses_nan_and_infinity() -> None:
    def sections(cls: type[Section]) -> list[type[Section]]:
        return [cls, *(s for sub in cls.__subclasses__() for s in sections(sub))]

    every = sections(Section)
    assert len(every) > 20
    assert [c for c in every if c.model_config.get("allow_inf_nan") is not False] == []


def test_missing_key_points_at_the_section_file() -> None:
    data = run_dict()
    del data["model"]["hidden_size"]
    issue = errors_of(data).issues[0]
    assert issue.key == "model.hidden_size" and issue.message == "required key is missing"
    assert str(issue.location) == "conf/model/qwen3-4b.yaml:1"
    assert "in conf/model/qwen3-4b.yaml" in issue.fix


def test_every_broken_interpolation_is_reported() -> None:
    data = run_dict(
        model__ref_load="${model.nope}", recipe__data__prompt_data="${missing_resolver:x}"
    )
    data["recipe"]["eval"]["datasets"][0]["path"] = "${recipe.data.nowhere}"
    error = errors_of(data)
    assert [i.key for i in error.issues] == [
        "model.ref_load",
        "recipe.data.prompt_data",
        "recipe.eval.datasets.0.path",
    ]
    assert error.issues[0].value == "${model.nope}"
    assert str(error.issues[0].location) == "command line: model.ref_load=${model.nope}"


def test_a_broken_interpolation_hides_no_other_problem() -> None:
    """The values that resolve are validated and checked beside the broken one: one run
    lists every problem, and the broken key is not reported again as missing."""
    data = run_dict(model__ref_load="${model.nope}", recipe__rollout__batch_size="many")
    data["recipe"]["rollout"]["temperture"] = 0.7
    data["recipe"]["eval"]["datasets"][0]["path"] = "${recipe.data.nowhere}"
    data["layout"] = {"rollout": {"sglang": {"port": 30000}}}
    keys = [i.key for i in errors_of(data).issues]
    assert keys[:2] == ["model.ref_load", "recipe.eval.datasets.0.path"]
    assert sorted(keys[2:]) == [
        "layout.rollout.sglang.port",
        "recipe.rollout.batch_size",
        "recipe.rollout.temperture",
    ]


def test_mandatory_missing_value_is_reported() -> None:
    data = run_dict(model__hf_checkpoint="???")
    issue = errors_of(data).issues[0]
    assert issue.key == "model.hf_checkpoint" and "missing" in issue.message


def test_post_checks_run_even_when_the_schema_fails() -> None:
    data = run_dict(recipe__rollout__temperature=0.0)
    data["layout"] = {"rollout": {"sglang": {"port": 30000}}}
    data["recipe"]["rollout"]["dynamic_sampling_filter"] = "rlpost.filters.nothing"
    keys = [i.key for i in errors_of(data).issues]
    assert keys == [
        "recipe.rollout.temperature",
        "layout.rollout.sglang.port",
        "recipe.rollout.dynamic_sampling_filter",
    ]


def test_a_path_written_with_a_tilde_is_read_in_the_home_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every path the run reads or writes gets `~` expanded where the config is validated:
    nothing downstream expands it (the tokenizer took '~/x' for a hub id, and run.dir made a
    './~' folder)."""
    from rlpost.config.loader import compose_run_config

    monkeypatch.setenv("HOME", str(tmp_path))
    run, _ = compose_run_config(
        [
            "model.hf_checkpoint='~/qwen3-tiny'",  # ref_load is ${.hf_checkpoint}
            "model.load='~/sft'",
            "recipe.data.prompt_data='~/data/train.jsonl'",
            "recipe.eval.datasets.0.path='~/data/eval.jsonl'",
            "run.dir='~/runs/a'",
            "run.resume='~/runs/b/ckpt/rollout_4'",
        ]
    )
    home = str(tmp_path)
    assert run.model.hf_checkpoint == run.model.ref_load == f"{home}/qwen3-tiny"
    assert run.model.load == f"{home}/sft"
    assert run.recipe.data.prompt_data == f"{home}/data/train.jsonl"
    assert run.recipe.eval.datasets[0].path == f"{home}/data/eval.jsonl"
    assert (run.run.dir, run.run.resume) == (f"{home}/runs/a", f"{home}/runs/b/ckpt/rollout_4")
    run, _ = compose_run_config(["run.dir=runs/a", "run.resume=auto"])
    assert (run.run.dir, run.run.resume) == ("runs/a", "auto")  # all else as written
