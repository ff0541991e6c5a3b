"""Command-line entry points: the Hydra launcher (launch.py) and the `rlpost` command (main)."""
