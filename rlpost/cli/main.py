"""The `rlpost` console command: the same launcher as `python launch.py`."""

from rlpost.cli.launch import main

__all__ = ["main"]
