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

from omegaconf import DictConfig, OmegaConf, open_dict
from pydantic import ValidationError

from rlpost.config.diagnostics import (
    attach_locations,
    issues_from_validation_error,
    resolve_config,
    value_at,
)
from rlpost.config.hf_check import check_hf_config
from rlpost.config.hook_checks import check_hooks
from rlpost.config.overrides import check_overrides, search_roots
from rlpost.config.resolvers import register_resolvers
from rlpost.config.sglang_options import check_sglang_options
from rlpost.config.sources import CONF_DIR, SourceMap, defer_source_map
from rlpost.errors import Issue, UserError
from rlpost.schema import RunConfig

PRIMARY_CONFIG = "config"

PostCheck = Callable[[Mapping[str, Any], SourceMap], list[Issue]]


def _sglang(data: Mapping[str, Any], sources: SourceMap) -> list[Issue]:
    return check_sglang_options(value_at(data, "layout.rollout.sglang"))


def _hooks(data: Mapping[str, Any], sources: SourceMap) -> list[Issue]:
    return check_hooks(data)


def _hf_config(data: Mapping[str, Any], sources: SourceMap) -> list[Issue]:
    return check_hf_config(data, sources.get)


# Checks beyond the schema, run on the resolved values whether or not the schema passed, so
# one run reports every problem.
POST_CHECKS: tuple[PostCheck, ...] = (_sglang, _hooks, _hf_config)


def load_run_config(cfg: DictConfig, sources: SourceMap) -> RunConfig:
    """Resolve interpolations, validate, run the post checks; UserError lists every problem."""
    data, issues = resolve_config(cfg, sources)
    if issues:
        raise UserError(issues)
    run: RunConfig | None = None
    try:
        run = RunConfig.model_validate(data)
    except ValidationError as exc:
        issues.extend(issues_from_validation_error(exc, data, sources))
    for check in POST_CHECKS:
        issues.extend(check(data, sources))
    if issues or run is None:
        raise UserError(attach_locations(issues, sources))
    return run


def _compose_failure(exc: Exception) -> UserError:
    text = str(exc).strip() or type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        text += f": {str(cause).strip().splitlines()[0]}"
    return UserError(
        [
            Issue(
                key="defaults",
                message=f"Hydra could not compose the config: {text}",
                fix="check the group choices, the defaults lists and the YAML syntax of the "
                "files named above",
            )
        ]
    )


def compose_run_config(
    overrides: Sequence[str] = (),
    *,
    search_path: Sequence[str | Path] = (),
    config_name: str = PRIMARY_CONFIG,
) -> tuple[RunConfig, SourceMap]:
    """Compose conf/ (plus `search_path` dirs, searched after it) and validate.

    Overrides are checked first exactly as the launcher checks its command line.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    urls = [str(Path(p).resolve()) for p in search_path]
    roots = search_roots(searchpath=urls)
    final = check_overrides(list(overrides), roots)
    if urls:
        final.append(f"hydra.searchpath=[{','.join(f'file://{u}' for u in urls)}]")
    register_resolvers()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name, overrides=final, return_hydra_config=True)
            config_sources = OmegaConf.to_container(cfg.hydra.runtime.config_sources)
            sources = defer_source_map(config_name, final, config_sources)  # type: ignore[arg-type]
            with open_dict(cfg):
                del cfg["hydra"]
            return load_run_config(cfg, sources), sources
    except (HydraException, OSError) as exc:
        raise _compose_failure(exc) from None
