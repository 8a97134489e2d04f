"""Helpers for tests and demos: random-weight checkpoints in the released layout, synthetic codes."""
