"""A sweep's overrides as typed: Hydra's sweeper rewrites each value it parsed (1e-5 becomes
1e-05, 1e-4 becomes 0.0001), and what rlpost shows of a job maps them back."""

from __future__ import annotations

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from rlpost.config.typed_overrides import own_overrides, typed_forms


def hydra_jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs' overrides as Hydra's basic sweeper hands them to the jobs."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def test_each_jobs_override_maps_back_to_the_text_typed() -> None:
    typed = [
        "recipe.optim.lr=1e-5,1e-4",
        "+recipe.tags=[1,2],[3, 4]",
        "run.note='a,b',c",
        "recipe.algo.kl_coef=1e-3",
    ]
    jobs = hydra_jobs(typed)
    assert jobs[0] == [
        "recipe.optim.lr=1e-05", "+recipe.tags=[1,2]", "run.note='a,b'", "recipe.algo.kl_coef=0.001"
    ]  # fmt: skip
    forms = typed_forms(typed)
    assert [forms[o] for o in jobs[-1]] == [
        "recipe.optim.lr=1e-4", "+recipe.tags=[3, 4]", "run.note=c", "recipe.algo.kl_coef=1e-3"
    ]  # fmt: skip
    assert own_overrides(jobs[:2], forms) == [["run.note='a,b'"], ["run.note=c"]]
    assert own_overrides([jobs[0], jobs[-1]], forms) == [
        ["recipe.optim.lr=1e-5", "recipe.tags=[1,2]", "run.note='a,b'"],
        ["recipe.optim.lr=1e-4", "recipe.tags=[3, 4]", "run.note=c"],
    ]


def test_a_sweep_written_with_a_function_keeps_hydras_spelling() -> None:
    """range(), choice() and the like: the text typed is no list of the values, so each job
    is named as Hydra names it rather than by a guess."""
    typed = ["run.seed=range(1,3)", "recipe.optim.lr=choice(1e-5,1e-4)", "broken=[1,"]
    assert typed_forms(typed) == {}
    assert own_overrides([["run.seed=1"], ["run.seed=2"]]) == [["run.seed=1"], ["run.seed=2"]]
