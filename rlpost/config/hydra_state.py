"""Hydra's global state outside a `@hydra.main` task: initialized on a given search path for
the length of a `with` block, and restored after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any


def session(elements: Iterable[tuple[str, str]]) -> contextlib.AbstractContextManager[None]:
    """Initialize Hydra's global state on `elements` (provider, url), restoring it after."""
    from hydra import version
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra._internal.hydra import Hydra
    from hydra.core.plugins import Plugins
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    Plugins.instance()  # registers the file:// and pkg:// config sources

    @contextlib.contextmanager
    def held() -> Iterator[None]:
        backup = get_gh_backup()
        version.setbase(None)
        search_path = ConfigSearchPathImpl()
        for provider, url in elements:
            search_path.append(provider, url)
        Hydra.create_main_hydra2(task_name="rlpost", config_search_path=search_path)
        try:
            yield
        finally:
            restore_gh_from_backup(backup)

    return held()


def session_from_sources(
    config_sources: Iterable[Mapping[str, Any]],
) -> contextlib.AbstractContextManager[None]:
    """Hydra initialized on a composed job's `hydra.runtime.config_sources`, in their order."""
    elements = []
    for source in config_sources:
        path, scheme = str(source["path"]), str(source["schema"])
        elements.append((str(source["provider"]), path if "://" in path else f"{scheme}://{path}"))
    return session(elements)
