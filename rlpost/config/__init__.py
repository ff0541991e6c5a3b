"""Composing and validating a run's config (Hydra in, typed RunConfig out)."""
