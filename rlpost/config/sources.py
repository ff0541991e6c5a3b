"""Where each key of a composed config was set: YAML file and line, or the command line.

Hydra merges files in the order of its defaults list, each under its package (`model`,
`recipe`, `_global_` for the `# @package _global_` layouts), then applies command-line
overrides. `build_source_map` replays that order over the same files, parsed with line
numbers, so an error about `recipe.rollout.temperature` can name the file and line that set
it (last writer wins). Keys that nothing set keep their schema default.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from rlpost.errors import Location

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

DEFAULT = Location()
# conf/ of the source tree; an installed wheel carries a copy as rlpost/conf (package data)
_TREE_CONF = Path(__file__).resolve().parents[2] / "conf"
CONF_DIR = _TREE_CONF if _TREE_CONF.is_dir() else Path(__file__).resolve().parents[1] / "conf"
PRIMARY_CONFIG = "config"


class _Readable(Protocol):
    def is_file(self) -> bool: ...
    def read_text(self, encoding: str | None = None) -> str: ...


@dataclass(frozen=True)
class ConfigRoot:
    """One entry of Hydra's config search path (`file://dir` or `pkg://module`)."""

    scheme: str
    path: str

    @classmethod
    def parse(cls, url: str) -> ConfigRoot:
        scheme, sep, rest = url.partition("://")
        return cls(scheme, rest) if sep else cls("file", url)

    def _base(self) -> Any:
        if self.scheme == "file":
            return Path(self.path)
        if self.scheme == "pkg":
            try:
                return importlib.resources.files(self.path.replace("/", "."))
            except ModuleNotFoundError:
                return None
        return None  # structured:// (the ConfigStore) has no files

    def find(self, config_path: str) -> _Readable | None:
        """The YAML file of `config_path` ('model/glm4-9b') in this root, if it is here."""
        base = self._base()
        if base is None:
            return None
        name = config_path if config_path.endswith(".yaml") else f"{config_path}.yaml"
        candidate = base / name
        return candidate if candidate.is_file() else None

    def options(self, group: str) -> list[str]:
        """Config names in `group` ('model' -> ['glm4-9b', ...])."""
        base = self._base()
        folder = base / group if base is not None else None
        if folder is None or not folder.is_dir():
            return []
        return [e.name[: -len(".yaml")] for e in folder.iterdir() if e.name.endswith(".yaml")]


def display_path(file: Any) -> str:
    """A path relative to the working directory when inside it, else absolute."""
    path = Path(str(file))
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve()) if path.exists() else str(file)


def override_text(override: Override) -> str:
    """The override as the user wrote it (the launcher adds '++' to schema keys itself)."""
    line = override.input_line or override.get_key_element()
    return line[2:] if line.startswith("++") else line


class SourceMap:
    """Dotted key path ('recipe.rollout.temperature', 'recipe.eval.datasets.0') -> Location.

    Built eagerly from `entries`, or on first use from `build` (a valid config never needs
    one, so the launcher defers the cost of replaying the defaults list).
    """

    def __init__(
        self,
        entries: Mapping[str, Location] | None = None,
        *,
        build: Callable[[], Mapping[str, Location]] | None = None,
    ) -> None:
        self._entries = dict(entries) if entries is not None else None
        self._build = build

    @property
    def entries(self) -> Mapping[str, Location]:
        if self._entries is None:
            self._entries = dict(self._build()) if self._build is not None else {}
        return self._entries

    def get(self, key: str) -> Location:
        """Where `key` was set; `DEFAULT` (renders "default") when no file or override set it."""
        return self.entries.get(key, DEFAULT)

    def set_at_or_below(self, key: str) -> Location:
        """Where `key` was set; for a section nothing set whole, the command-line override
        that set a key inside it (`layout.rollout.sglang.mem_fraction_static=0.8` for
        `layout.rollout.sglang`); else `DEFAULT`."""
        found = self.entries.get(key)
        if found is not None:
            return found
        prefix = f"{key}."
        inside = [
            loc
            for k, loc in self.entries.items()
            if k.startswith(prefix) and loc.override is not None
        ]
        return inside[-1] if inside else DEFAULT

    def locate(self, key: str) -> Location:
        """Where `key` was set, else where its nearest enclosing key was (for missing keys)."""
        parts = key.split(".")
        for end in range(len(parts), 0, -1):
            found = self.entries.get(".".join(parts[:end]))
            if found is not None:
                return found
        return DEFAULT

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)


class _Recorder:
    """Applies writes in merge order; OmegaConf merges mappings and replaces lists."""

    def __init__(self) -> None:
        self.entries: dict[str, Location] = {}

    def clear_below(self, key: str) -> None:
        prefix = f"{key}."
        for stale in [k for k in self.entries if k.startswith(prefix)]:
            del self.entries[stale]

    def record_node(self, node: yaml.Node, key: str, file: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                child = f"{key}.{key_node.value}" if key else str(key_node.value)
                self.entries[child] = Location(file=file, line=key_node.start_mark.line + 1)
                self.record_node(value_node, child, file)
        elif isinstance(node, yaml.SequenceNode):
            self.clear_below(key)
            for index, item in enumerate(node.value):
                child = f"{key}.{index}"
                self.entries[child] = Location(file=file, line=item.start_mark.line + 1)
                self.record_node(item, child, file)
        elif key:
            self.clear_below(key)

    def record_value(self, value: Any, key: str, location: Location) -> None:
        self.entries[key] = location
        if isinstance(value, Mapping):
            for name, item in value.items():
                self.record_value(item, f"{key}.{name}", location)
        elif isinstance(value, Sequence) and not isinstance(value, str):
            self.clear_below(key)
            for index, item in enumerate(value):
                self.record_value(item, f"{key}.{index}", location)
        else:
            self.clear_below(key)


def _record_file(rec: _Recorder, text: str, file: str, package: str, primary: bool) -> None:
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(root, yaml.MappingNode):
        return
    if package:  # the file as a whole: where a key missing from this section belongs
        rec.entries[package] = Location(file=file, line=1)
    for key_node, value_node in root.value:
        name = str(key_node.value)
        if name == "defaults" or (primary and name == "hydra"):
            continue  # the defaults list and Hydra's own settings are not run config
        key = f"{package}.{name}" if package else name
        rec.entries[key] = Location(file=file, line=key_node.start_mark.line + 1)
        rec.record_node(value_node, key, file)


def find_config(roots: Sequence[ConfigRoot], config_path: str) -> _Readable | None:
    """The file Hydra loads for `config_path`: the first root that has it, as Hydra searches."""
    for root in roots:
        found = root.find(config_path)
        if found is not None:
            return found
    return None


def group_options(roots: Sequence[ConfigRoot], group: str) -> list[str]:
    """Every config name in `group` over all roots, sorted."""
    return sorted({name for root in roots for name in root.options(group)})


def source_map_from_defaults(
    defaults: Iterable[Any], config_overrides: Iterable[Override], roots: Sequence[ConfigRoot]
) -> SourceMap:
    """Replay a Hydra defaults list (ResultDefault items) and its key overrides."""
    rec = _Recorder()
    for default in defaults:
        path, package = default.config_path, default.package or ""
        if path is None or path.startswith("hydra/") or package.split(".")[0] == "hydra":
            continue
        file = find_config(roots, path)
        if file is None:
            continue  # a structured (ConfigStore) node: no file to point at
        package = "" if package == "_global_" else package
        rec_file = display_path(file)
        _record_file(rec, file.read_text(encoding="utf-8"), rec_file, package, default.primary)
    for override in config_overrides:
        key = override.key_or_group
        if key.split(".")[0] == "hydra":
            continue
        rec.clear_below(key)
        if override.is_delete():
            rec.entries.pop(key, None)
            continue
        value = None if override.is_sweep_override() else override.value()
        rec.record_value(value, key, Location(override=override_text(override)))
    return SourceMap(dict(rec.entries))


def roots_from_sources(config_sources: Iterable[Any]) -> list[ConfigRoot]:
    """Search-path roots from `hydra.runtime.config_sources` entries (path, schema)."""
    roots = []
    for source in config_sources:
        path, schema = str(source["path"]), str(source["schema"])
        roots.append(ConfigRoot(schema, path.partition("://")[2] if "://" in path else path))
    return roots


def build_source_map(
    config_name: str, overrides: Sequence[str], config_sources: Iterable[Any]
) -> SourceMap:
    """The SourceMap of the config Hydra composed for `config_name` and `overrides`.

    Call it while Hydra is initialized (inside a `@hydra.main` task or an
    `initialize_config_dir` block); `config_sources` is `hydra.runtime.config_sources`.
    """
    return _compute(config_name, overrides, list(config_sources))


def defer_source_map(
    config_name: str,
    overrides: Sequence[str],
    config_sources: Iterable[Any],
    config_dir: Path = CONF_DIR,
) -> SourceMap:
    """`build_source_map`, computed on first use (re-initializing Hydra on the same search
    path, or on `config_dir` when none is given, if the caller's Hydra context has ended)."""
    sources, final = list(config_sources), list(overrides)

    def build() -> Mapping[str, Location]:
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        from rlpost.config.hydra_state import session_from_sources

        if GlobalHydra.instance().is_initialized():
            return _compute(config_name, final, sources).entries
        if sources:
            with session_from_sources(sources):
                return _compute(config_name, final, sources).entries
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return _compute(config_name, final, sources).entries

    return SourceMap(build=build)


def _compute(config_name: str, overrides: Sequence[str], config_sources: list[Any]) -> SourceMap:
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    loader = GlobalHydra.instance().config_loader()
    defaults = loader.compute_defaults_list(
        config_name=config_name, overrides=list(overrides), run_mode=RunMode.RUN
    )
    return source_map_from_defaults(
        defaults.defaults, defaults.config_overrides, roots_from_sources(config_sources)
    )
