"""Backends: export an artifact, open a runner for it (:mod:`.registry`). Each imports its toolchain lazily."""
