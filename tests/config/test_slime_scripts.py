"""slime's own launch scripts (tests/fixtures/slime, copied from slime at 624b824a) import as the
README's table says: each row's outcome, model and reason, and never a traceback."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from rlpost.config.loader import compose_run_config
from rlpost.errors import UserError
from rlpost.interop.slime_import import import_slime
from rlpost.plan import plan_config

ROOT = Path(__file__).resolve().parents[2]
SLIME = ROOT / "tests" / "fixtures" / "slime"
ENV = {"BASE_DIR": "/root", "BASE_FOLDER": "/root", "HIP_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
"""What the README's table gives every script with --env (three refuse to start without)."""


def table() -> dict[str, tuple[str, str, str]]:
    """script -> (outcome, model, reason) from the README's table of slime's scripts."""
    text = (ROOT / "README.md").read_text()
    start = text.index("| slime script | outcome | model | reason |")
    rows: dict[str, tuple[str, str, str]] = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        script, outcome, model, reason = (c.strip().strip("`") for c in line.strip("|").split("|"))
        rows[script] = (outcome, model, reason)
    return rows


def words(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def test_the_table_has_every_script_once() -> None:
    assert sorted(table()) == sorted(p.name for p in (SLIME / "scripts").glob("run-*.sh"))
    outcomes = [row[0] for row in table().values()]
    assert outcomes.count("imports and plans") >= 10


@pytest.mark.parametrize("script", sorted(table()))
def test_each_slime_script_meets_its_row(script: str, tmp_path: Path) -> None:
    outcome, model, reason = table()[script]
    try:
        imported = import_slime(SLIME / "scripts" / script, SLIME, env=ENV)
    except UserError as refused:
        assert outcome == "refused", f"{script}: {refused}"
        assert words(reason) in words(str(refused))
        return
    assert outcome in ("imports and plans", "imports; the plan refuses it"), script
    assert imported.model == model
    imported.write(tmp_path)
    cfg, _ = compose_run_config(
        [*imported.overrides(), *imported.extra_overrides()], config_dir=tmp_path
    )
    if outcome == "imports and plans":
        plan_config(cfg)
        return
    with pytest.raises(UserError) as refused:
        plan_config(cfg)
    assert words(reason) in words(str(refused.value))


def test_nothing_a_script_names_is_written_into_yaml(tmp_path: Path) -> None:
    """A secret the script reads from its environment stays out of the YAML."""
    script = tmp_path / "run-secret.sh"
    text = (SLIME / "scripts" / "run-qwen3-4B.sh").read_text()
    script.write_text(
        re.sub(r"   # --wandb-key \$\{WANDB_KEY\}", "   --use-wandb --wandb-key ${WANDB_KEY}", text)
    )
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "qwen3-4B.sh").write_text(
        (SLIME / "scripts" / "models" / "qwen3-4B.sh").read_text()
    )
    imported = import_slime(script, env={"WANDB_KEY": "s3cret-value", "MY_TOKEN": "t0ken"})
    written = imported.write(tmp_path / "out")
    assert all("s3cret" not in path.read_text() for path in written)
    assert "s3cret" not in repr(imported)
    assert "t0ken" not in repr(imported)


@dataclass(frozen=True)
class Seed:
    """A seed document (tests/fixtures/seeds), the shipped run it is, and how a user completes
    it into a launch script where the document leaves gaps."""

    model: str
    hardware: str
    command: str = ""
    """the train command when the document shows none (it runs a script of slime's instead)"""
    left_out: tuple[str, ...] = ()
    """arrays the user leaves out, for the reason the document gives"""
    recipe_differs: tuple[str, ...] = ()
    """recipe keys the document does not set, so slime's defaults differ from the shipped run"""


SEED_DOCS = {
    "glm4-9B.txt": Seed("glm4-9b", "h100x8"),
    "qwen3-4B.txt": Seed("qwen3-4b", "h100x8"),
    # It shows the flags that differ from the Qwen3-4B page (its "..." stands for that page's
    # arrays) and runs slime's script: 8 nodes of 8, colocated, model arguments first.
    "glm4.5-355B-A32B.txt": Seed(
        "glm4.5-355b-a32b",
        "h100x64",
        command="python3 train.py --actor-num-nodes 8 --actor-num-gpus-per-node 8 --colocate "
        "${MODEL_ARGS[@]} ${CKPT_ARGS[@]} ${ROLLOUT_ARGS[@]} ${OPTIMIZER_ARGS[@]} "
        "${GRPO_ARGS[@]} ${PERF_ARGS[@]} ${EVAL_ARGS[@]} ${SGLANG_ARGS[@]} ${MISC_ARGS[@]}",
    ),
    # "MTP training for GLM-4.7-Flash is not yet supported": its SPEC_ARGS stay out; and the
    # page has no CKPT_ARGS, so nothing is saved periodically.
    "glm4.7-Flash.txt": Seed(
        "glm4.7-flash", "h100x8", left_out=("SPEC_ARGS",), recipe_differs=("save",)
    ),
}


def arrays(document: str) -> dict[str, list[str]]:
    """Each argument array's first definition (later ones are variants: FP8, more nodes),
    as its lines."""
    found: dict[str, list[str]] = {}
    for name, body in re.findall(r"^ *([A-Z_]+)=\(\n(.*?)^ *\)$", document, re.M | re.S):
        found.setdefault(name, body.splitlines())
    return found


def completed(document: str, seed: Seed) -> str:
    """The launch script a user writes from a seed document: its model script sourced, its
    argument arrays (a `...` line: the Qwen3-4B page's array of that name), and its first
    `ray job submit ... \\` command (the rest are fragments), or the seed's command."""
    model = re.search(r"source \S*models/([\w.-]+\.sh)", document)
    assert model is not None
    base = arrays((ROOT / "tests" / "fixtures" / "seeds" / "qwen3-4B.txt").read_text())
    mine = {k: v for k, v in arrays(document).items() if k not in seed.left_out}
    if seed.command:
        mine = {**{k: v for k, v in base.items() if k not in mine}, **mine}
    blocks = []
    for name, lines in mine.items():
        if any(line.strip() == "..." for line in lines):
            lines = base.get(name, []) + [line for line in lines if line.strip() != "..."]
        blocks.append("\n".join([f"{name}=(", *lines, ")"]))
    blocks += [f"{name}=()" for name in seed.left_out]
    if seed.command:
        command = [seed.command]
    else:
        start = document.index('ray job submit --address="http://127.0.0.1:8265"')
        command = []
        for line in document[start:].splitlines():
            command.append(line)
            if not line.rstrip().endswith("\\"):
                break
    return "\n".join(
        ['SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"',
         f'source "${{SCRIPT_DIR}}/models/{model.group(1)}"', *blocks, *command, ""]
    )  # fmt: skip


@pytest.mark.parametrize("document", sorted(SEED_DOCS))
def test_the_seed_documents_import_to_the_shipped_plans(document: str, tmp_path: Path) -> None:
    seed = SEED_DOCS[document]
    text = (ROOT / "tests" / "fixtures" / "seeds" / document).read_text()
    script = tmp_path / f"run-{document.removesuffix('.txt')}.sh"
    script.write_text(completed(text, seed))
    imported = import_slime(script, SLIME)
    imported.write(tmp_path / "out")
    cfg, _ = compose_run_config(
        [*imported.overrides(), *imported.extra_overrides()], config_dir=tmp_path / "out"
    )
    _, plan = plan_config(cfg)
    shipped, _ = compose_run_config(
        [f"model={seed.model}", "recipe=grpo_dapo", f"hardware={seed.hardware}"]
    )
    _, expected = plan_config(shipped)
    assert cfg.model.name.startswith(seed.model) and cfg.hardware.name == seed.hardware
    ours, theirs = plan.to_dict(), expected.to_dict()  # type: ignore[attr-defined]
    for section in ("placement", "parallel", "engine", "batch", "memory", "work"):
        assert ours[section] == theirs[section], section
    differ = {
        key: (value, shipped.recipe.model_dump().get(key))
        for key, value in cfg.recipe.model_dump(exclude={"name", "description"}).items()
        if value != shipped.recipe.model_dump().get(key)
    }
    assert sorted(differ) == sorted(seed.recipe_differs), differ


def test_a_seed_document_without_its_rollout_arguments_is_refused_as_slime_refuses_it(
    tmp_path: Path,
) -> None:
    """The GLM-4.5 page alone (no ROLLOUT_ARGS): slime's parser requires --rollout-batch-size."""
    text = (ROOT / "tests" / "fixtures" / "seeds" / "glm4.5-355B-A32B.txt").read_text()
    seed = SEED_DOCS["glm4.5-355B-A32B.txt"]
    script = tmp_path / "run-glm4.5.sh"
    script.write_text(completed(text, seed).replace("${ROLLOUT_ARGS[@]}", ""))
    with pytest.raises(UserError) as refused:
        import_slime(script, SLIME)
    assert "--rollout-batch-size" in str(refused.value)
    assert "requires" in str(refused.value)


def test_a_script_of_a_shipped_model_keeps_it_with_its_own_paths() -> None:
    """slime's glm4-9B script describes rlpost's glm4-9b: the written model is that one, with
    the script's checkpoint paths, not a model drawn anew."""
    imported = import_slime(SLIME / "scripts" / "run-glm4-9B.sh", SLIME, env=ENV)
    shipped = yaml.safe_load((ROOT / "conf" / "model" / "glm4-9b.yaml").read_text())
    assert imported.model_file is not None
    paths = {"name", "hf_checkpoint", "ref_load", "load"}
    assert {k: v for k, v in imported.model_file.items() if k not in paths} == {
        k: v for k, v in shipped.items() if k not in paths
    }


FULLY_ASYNC = SLIME / "examples" / "fully_async"


@pytest.mark.parametrize(
    ("script", "feature"),
    [
        ("run-qwen2.5-0.5B-fully_async.sh", "q/k/v bias, which no rlpost family has"),
        ("run-qwen3.5-9B-fully_async.sh", "gated delta-net linear attention (Qwen3.5)"),
    ],
)
def test_slimes_fully_async_examples_are_refused_for_their_models(
    script: str, feature: str
) -> None:
    with pytest.raises(UserError) as refused:
        import_slime(FULLY_ASYNC / script, SLIME, env=ENV)
    assert feature in words(str(refused.value))


def test_slimes_fully_async_rollout_imports_as_the_fully_async_loop(tmp_path: Path) -> None:
    """The Qwen2.5 example with a model rlpost has (as a user would swap it): the loop maps,
    and the two ways slime's differs are said."""
    text = (FULLY_ASYNC / "run-qwen2.5-0.5B-fully_async.sh").read_text()
    script = tmp_path / "examples" / "fully_async" / "run-qwen3-0.6B-fully_async.sh"
    script.parent.mkdir(parents=True)
    script.write_text(text.replace("models/qwen2.5-0.5B.sh", "models/qwen3-0.6B.sh"))
    imported = import_slime(script, SLIME, env=ENV)
    assert imported.values["recipe.loop.mode"] == "fully_async"
    [note] = [u for u in imported.unmapped if u.flag == "--rollout-function-path"]
    assert "bounds no policy lag" in note.reason and note.nearest == "recipe.loop.max_staleness"
    imported.write(tmp_path / "out")
    cfg, _ = compose_run_config(
        [*imported.overrides(), *imported.extra_overrides()], config_dir=tmp_path / "out"
    )
    _, plan = plan_config(cfg)
    assert cfg.recipe.loop.mode == "fully_async" and not plan.placement.colocate  # type: ignore[attr-defined]


def test_a_multi_node_script_lists_its_head_and_workers(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("10.0.0.1 slots=8\n10.0.0.2 slots=8\n10.0.0.3 slots=8\n")
    env = {**ENV, "MASTER_ADDR": "10.0.0.1", "HOSTFILE": str(hostfile)}
    imported = import_slime(SLIME / "scripts" / "run-glm4.7-355B-A32B.sh", SLIME, env=env)
    assert imported.cluster_notes[0].startswith("Ray head started with --num-gpus 8")
    workers = [n for n in imported.cluster_notes if n.startswith("Ray worker: ssh root@")]
    # the script starts its workers as background jobs at once: either may be recorded first
    assert sorted(w.split()[3] for w in workers) == ["root@10.0.0.2", "root@10.0.0.3"]
    assert all("ray start --address=10.0.0.1:6379" in w for w in workers)
