"""OmegaConf resolvers shipped configs rely on; registered before any compose."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"


def asset_path(relative: str) -> str:
    """`${asset:qwen3-tiny}` -> the absolute path of a file shipped in rlpost/assets."""
    return str(ASSETS_DIR / relative)


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("asset"):
        OmegaConf.register_new_resolver("asset", asset_path)
