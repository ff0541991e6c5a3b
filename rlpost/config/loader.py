"""From a composed DictConfig to a validated RunConfig, or one UserError listing every problem.

    run, sources = compose_run_config(["model=qwen3-4b", "hardware=h100x8"])

`load_run_config` is the single validation seam: the launcher calls it inside its Hydra
task; `compose_run_config` is the same path for callers that are not a `@hydra.main`
(tests, tools).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from pydantic import ValidationError

from rlpost.config.diagnostics import (
    attach_locations,
    issues_beside,
    issues_from_validation_error,
    resolve_config,
    value_at,
)
from rlpost.config.eval_mode import check_eval_training_overrides
from rlpost.config.eval_sets import check_eval_set_overrides
from rlpost.config.hf_check import check_hf_config
from rlpost.config.hook_checks import check_hooks
from rlpost.config.overrides import check_overrides, command_line_searchpath, search_roots
from rlpost.config.resolvers import register_resolvers
from rlpost.config.sglang_options import check_sglang_options
from rlpost.config.sources import PRIMARY_CONFIG as PRIMARY_CONFIG
from rlpost.config.sources import SourceMap, defer_source_map
from rlpost.errors import Issue, UserError
from rlpost.schema import RunConfig

PostCheck = Callable[[Mapping[str, Any], SourceMap], list[Issue]]


def _sglang(data: Mapping[str, Any], sources: SourceMap) -> list[Issue]:
    return check_sglang_options(value_at(data, "layout.rollout.sglang"))


def _hooks(data: Mapping[str, Any], sources: SourceMap) -> list[Issue]:
    return check_hooks(data)


def _hf_config(data: Mapping[str, Any], sources: SourceMap) -> list[Issue]:
    return check_hf_config(data, sources.get)


# Checks beyond the schema, run on the resolved values whether or not the schema passed, so
# one run reports every problem.
POST_CHECKS: tuple[PostCheck, ...] = (
    _sglang,
    _hooks,
    _hf_config,
    check_eval_training_overrides,
    check_eval_set_overrides,
)


def load_run_config(cfg: DictConfig, sources: SourceMap) -> RunConfig:
    """Resolve interpolations, validate, run the post checks; UserError lists every problem."""
    data, unresolved = resolve_config(cfg, sources)
    if unresolved and not data:
        raise UserError(unresolved)
    issues: list[Issue] = []
    run: RunConfig | None = None
    try:
        run = RunConfig.model_validate(data)
    except ValidationError as exc:
        issues.extend(issues_from_validation_error(exc, data, sources))
    for check in POST_CHECKS:
        issues.extend(check(data, sources))
    issues = [*unresolved, *issues_beside(unresolved, issues)]
    if issues or run is None:
        raise UserError(attach_locations(issues, sources))
    return run


def compose_run_config(
    overrides: Sequence[str] = (),
    *,
    search_path: Sequence[str | Path] = (),
    config_name: str = PRIMARY_CONFIG,
    config_dir: str | Path | None = None,
) -> tuple[RunConfig, SourceMap]:
    """Compose conf/ (plus `config_dir` as `--config-dir` adds it, and `search_path` dirs as a
    command-line `hydra.searchpath`) and validate.

    Overrides are checked first exactly as the launcher checks its command line, and a
    composition failure (a missing defaults entry, broken YAML) is a located UserError.
    """
    from hydra import compose
    from hydra.errors import HydraException

    from rlpost.config.search_path import composition_issues, hydra_session, primary_searchpath

    urls = [str(Path(p).resolve()) for p in search_path]
    dir_text = None if config_dir is None else str(config_dir)
    # as the launcher reads them: a command-line hydra.searchpath, else the primary config's
    searchpath = (
        urls
        or command_line_searchpath(overrides)
        or primary_searchpath(search_roots(dir_text), config_name)
    )
    roots = search_roots(dir_text, searchpath=searchpath)
    final = check_overrides(list(overrides), roots)
    if urls:
        final.append(f"hydra.searchpath=[{','.join(f'file://{u}' for u in urls)}]")
    register_resolvers()
    with hydra_session(config_dir):
        try:
            cfg = compose(config_name, overrides=final, return_hydra_config=True)
        except (HydraException, OSError, yaml.YAMLError) as exc:
            raise UserError(composition_issues(exc, roots)) from None
        config_sources = OmegaConf.to_container(cfg.hydra.runtime.config_sources)
        sources = defer_source_map(config_name, final, config_sources)  # type: ignore[arg-type]
        with open_dict(cfg):
            del cfg["hydra"]
        return load_run_config(cfg, sources), sources
