"""Bounds on parsed JSON shared by every layer (the model code reads configs, the edge reads plans).

A hostile file must not overflow the stack or make a reader walk an unbounded tree, so depth is
counted level by level, without recursion, and counting stops just past the limit.
"""

from __future__ import annotations

from typing import Any

MAX_JSON_DEPTH = 32


def json_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """Nesting depth of parsed JSON (1 for a scalar); stops counting past ``limit``."""
    depth, level = 0, [value]
    while level and depth <= limit:
        depth += 1
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
    return depth
