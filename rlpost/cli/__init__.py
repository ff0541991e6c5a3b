"""Command-line entry points (the Hydra launcher)."""
