"""Plugins of the edge layers: the entry points of a group beside the built-in names, loaded with a clear error.

The backend and builder registries take third-party additions the same way: a package declares an entry
point in the registry's group; a built-in name always wins (a shadowing plugin is logged and ignored); a
plugin that fails to load is reported by name, never as a traceback from inside another package.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from importlib import metadata
from typing import Any

logger = logging.getLogger(__name__)


def plugin_entry_points(group: str, builtin: Collection[str], kind: str) -> dict[str, metadata.EntryPoint]:
    """The entry points of ``group`` by name, but those a built-in ``kind`` (e.g. "backend") of that name shadows."""
    found = {}
    for entry_point in metadata.entry_points(group=group):
        if entry_point.name in builtin:
            logger.warning("%s plugin %r is shadowed by the built-in %s of that name", kind, entry_point.name, kind)
            continue
        found[entry_point.name] = entry_point
    return found


def load_plugin(
    plugins: dict[str, metadata.EntryPoint], name: str, kind: str, known: Collection[str], error: type[Exception]
) -> Any:
    """What plugin ``name`` of ``plugins`` names; raises ``error`` listing the ``known`` names for an unknown one and
    naming the plugin for one that fails to load."""
    if name not in plugins:
        raise error(f"unknown {kind} {name!r}; known: {', '.join(known)}")
    try:
        return plugins[name].load()
    except Exception as exc:  # a plugin may fail in any way; say which one
        raise error(f"{kind} plugin {name!r} failed to load: {exc}") from exc
