"""SourceMap: each composed key points at the file and line, or the override, that set it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpost.config.loader import compose_run_config
from rlpost.config.sources import ConfigRoot, SourceMap, find_config
from rlpost.errors import Location

REPO = Path(__file__).resolve().parents[3]
CONF = REPO / "conf"


def line_of(path: Path, text: str, after: str | None = None) -> int:
    """1-based line of the first line containing `text` (after the line containing `after`)."""
    lines = path.read_text().splitlines()
    start = 0 if after is None else next(i for i, ln in enumerate(lines) if after in ln)
    return next(i for i, ln in enumerate(lines) if i >= start and text in ln) + 1


def located(sources: SourceMap, key: str) -> tuple[str, int | None]:
    where = sources.get(key)
    assert where.file is not None, f"{key} has no file: {where}"
    return Path(where.file).name, where.line


@pytest.fixture(scope="module")
def dynamic_sampling() -> SourceMap:
    _, sources = compose_run_config(
        [
            "model=glm4-9b",
            "recipe=grpo_dapo_dynamic_sampling",
            "hardware=h100x8",
            "recipe.rollout.temperature=0.8",
        ]
    )
    return sources


def test_group_files_are_placed_under_their_package(dynamic_sampling: SourceMap) -> None:
    model_file = CONF / "model" / "glm4-9b.yaml"
    assert located(dynamic_sampling, "model.num_layers") == (
        "glm4-9b.yaml",
        line_of(model_file, "num_layers:"),
    )
    hardware_file = CONF / "hardware" / "h100x8.yaml"
    assert located(dynamic_sampling, "hardware.gpus_per_node") == (
        "h100x8.yaml",
        line_of(hardware_file, "gpus_per_node:"),
    )


def test_nested_defaults_and_last_writer_wins(dynamic_sampling: SourceMap) -> None:
    base = CONF / "recipe" / "grpo_dapo.yaml"
    variant = CONF / "recipe" / "grpo_dapo_dynamic_sampling.yaml"
    # set only by the extended recipe
    assert located(dynamic_sampling, "recipe.rollout.batch_size") == (
        "grpo_dapo.yaml",
        line_of(base, "batch_size:", after="rollout:"),
    )
    # set by both: the variant is merged after its base
    assert located(dynamic_sampling, "recipe.name") == (
        "grpo_dapo_dynamic_sampling.yaml",
        line_of(variant, "name:"),
    )
    assert located(dynamic_sampling, "recipe.rollout.partial_rollout")[0] == variant.name


def test_global_package_layout_overrides_the_recipe(dynamic_sampling: SourceMap) -> None:
    layout = CONF / "layout" / "glm4-9b_h100x8.yaml"
    assert located(dynamic_sampling, "layout.train.tp") == (
        layout.name,
        line_of(layout, "tp:"),
    )
    # grpo_dapo sets max_tokens_per_gpu too; the layout is merged later
    assert located(dynamic_sampling, "recipe.train.max_tokens_per_gpu") == (
        layout.name,
        line_of(layout, "max_tokens_per_gpu:"),
    )


def test_list_items_and_primary_config(dynamic_sampling: SourceMap) -> None:
    base = CONF / "recipe" / "grpo_dapo.yaml"
    assert located(dynamic_sampling, "recipe.eval.datasets.0.path") == (
        "grpo_dapo.yaml",
        line_of(base, "path: /root/aime"),
    )
    assert located(dynamic_sampling, "mode") == (
        "config.yaml",
        line_of(CONF / "config.yaml", "mode:"),
    )
    assert not any(key.startswith("hydra") or key == "defaults" for key in dynamic_sampling)


def test_command_line_override_comes_last(dynamic_sampling: SourceMap) -> None:
    where = dynamic_sampling.get("recipe.rollout.temperature")
    assert where == Location(override="recipe.rollout.temperature=0.8")
    assert str(where) == "command line: recipe.rollout.temperature=0.8"


def test_unset_keys_are_defaults_and_missing_keys_find_their_section(
    dynamic_sampling: SourceMap,
) -> None:
    assert str(dynamic_sampling.get("recipe.rollout.top_k")) != "default"  # grpo_dapo sets it
    assert str(dynamic_sampling.get("recipe.rollout.max_concurrency")) == "default"
    assert str(dynamic_sampling.get("trainer.backend")) == "default"
    assert Path(dynamic_sampling.locate("model.not_a_field").file or "").name == "glm4-9b.yaml"


def test_user_config_dir_is_named_by_its_real_path(tmp_path: Path) -> None:
    (tmp_path / "recipe").mkdir()
    user_recipe = tmp_path / "recipe" / "my_recipe.yaml"
    user_recipe.write_text(
        "defaults:\n  - grpo_dapo\n  - _self_\n\nname: my_recipe\nrollout:\n  temperature: 0.7\n"
    )
    run, sources = compose_run_config(
        ["model=qwen3-4b", "recipe=my_recipe", "hardware=h100x8"], search_path=[tmp_path]
    )
    assert run.recipe.rollout.temperature == 0.7
    where = sources.get("recipe.rollout.temperature")
    assert where.file is not None and Path(where.file).resolve() == user_recipe.resolve()
    assert where.line == 7
    # the shipped base it extends is still named as such
    assert Path(sources.get("recipe.rollout.batch_size").file or "").name == "grpo_dapo.yaml"


def test_find_config_searches_roots_in_order(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "glm4-9b.yaml").write_text("name: shadow\n")
    first = find_config(
        [ConfigRoot("file", str(tmp_path)), ConfigRoot("file", str(CONF))], "model/glm4-9b"
    )
    assert first is not None and str(first).startswith(str(tmp_path))
    assert find_config([ConfigRoot("structured", "")], "model/glm4-9b") is None
    assert ConfigRoot.parse("pkg://hydra.conf").find("hydra/output/default") is not None


def test_a_data_files_line_names_its_own_place_not_a_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refused line of a prompt file is keyed by the file and line; no file or override set
    that key, and '(default)' beside it would say the config's default did. A config key
    refused beside it keeps the place it was set."""
    from rlpost.cli.main import main

    rendered = tmp_path / "rendered.jsonl"
    line = {"prompt": "<|im_start|>user\nWhat is 2+2?<|im_end|>\n", "label": "4"}
    rendered.write_text(json.dumps(line) + "\n")
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "validate",
                f"recipe.data.prompt_data={rendered}",
                "recipe.eval.datasets.0.path=/no/eval.jsonl",
            ]
        )
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"\n  {rendered}:1\n    'prompt' already holds the chat template's marker" in err, err
    assert "(default)" not in err, err
    assert "(command line: recipe.eval.datasets.0.path=/no/eval.jsonl)" in err, err
