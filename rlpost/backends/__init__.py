"""Trainer and engine backends behind small protocols."""
