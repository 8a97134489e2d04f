"""Plugins of the edge registries: one loader and one failure policy for hardware classes, backends and builders.

A package adds to a registry by declaring an entry point in the registry's group (:class:`PluginGroup`). The
policy is the same for every registry:

- a built-in name always wins: a plugin of that name is logged and ignored;
- names are listed without importing any plugin;
- asking for a plugin by name imports it, and one that fails to import, or gives what the registry cannot use,
  is the registry's typed error naming the plugin, never a traceback from inside another package;
- listing what every plugin gives (:meth:`PluginGroup.load_all`) logs and skips a broken one, so one broken
  package hides neither the built-ins nor the other plugins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from importlib import metadata
from typing import Any

logger = logging.getLogger(__name__)


class PluginGroup:
    """The plugins of one entry-point ``group`` beside a registry's ``builtin`` names.

    ``kind`` names one plugin in messages ("backend"); ``error`` is the registry's typed error; ``accept(name,
    value)`` turns what an entry point loads into the registry's value, raising ``error`` when it cannot.
    """

    def __init__(
        self,
        group: str,
        builtin: Collection[str],
        kind: str,
        error: type[Exception],
        accept: Callable[[str, Any], Any] = lambda _name, value: value,
    ):
        self.group, self.builtin, self.kind, self.error, self.accept = group, builtin, kind, error, accept

    def entry_points(self) -> dict[str, metadata.EntryPoint]:
        """The group's entry points by name, less those a built-in name shadows (logged)."""
        found = {}
        for entry_point in metadata.entry_points(group=self.group):
            if entry_point.name in self.builtin:
                logger.warning(
                    "%s plugin %r is shadowed by the built-in %s of that name", self.kind, entry_point.name, self.kind
                )
                continue
            found[entry_point.name] = entry_point
        return found

    def names(self) -> tuple[str, ...]:
        """Every name: the built-in ones, then the plugins' (none of them imported)."""
        return (*self.builtin, *self.entry_points())

    def load(self, name: str) -> Any:
        """What plugin ``name`` gives; raises ``error`` listing the known names for an unknown one, and naming the
        plugin for one that fails to load or gives what ``accept`` refuses."""
        return self._load(self.entry_points(), name)

    def _load(self, plugins: dict[str, metadata.EntryPoint], name: str) -> Any:
        if name not in plugins:
            raise self.error(f"unknown {self.kind} {name!r}; known: {', '.join((*self.builtin, *plugins))}")
        try:
            value = plugins[name].load()
        except Exception as exc:  # a plugin may fail in any way; say which one
            raise self.error(f"{self.kind} plugin {name!r} failed to load: {exc}") from exc
        return self.accept(name, value)

    def load_all(self) -> dict[str, Any]:
        """What every plugin gives, by name; a plugin that fails (:meth:`load`'s error) is logged and skipped."""
        loaded, plugins = {}, self.entry_points()  # one scan (a shadowed plugin is logged once)
        for name in plugins:
            try:
                loaded[name] = self._load(plugins, name)
            except self.error as exc:
                logger.warning("%s", exc)
        return loaded
