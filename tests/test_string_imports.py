"""Every dependency in ``vllm_omni/`` is an import statement ``lint-imports`` sees, or a declared exception.

A module, class or function named in a string (``importlib.import_module(name)``, ``__import__``, a
``"vllm_omni.pkg.module:attr"`` constant) is a dependency import-linter cannot see: the hardware layer once
called the builders two floors up that way, and the backend registry loaded ExecuTorch from a module the
contracts said never imports it, with every contract green. So the source tree names no module in a string
unless :data:`ALLOWED` lists it with the reason; an entry that something outside this package loads by name
says which ``pyproject.toml`` entry point declares it, and that is checked too.
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

# A whole string that is a module path, optionally with ``:attribute`` (how entry points and vLLM name things).
DOTTED_PATH = re.compile(r"vllm_omni(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_][\w.]*)?")
# The start of an f-string that builds one: ``f"vllm_omni.edge.{name}"``.
DOTTED_PREFIX = re.compile(r"vllm_omni\.[\w.]*")
IMPORT_CALLS = {"import_module", "__import__"}
HOW_TO_FIX = (
    "import it with an import statement instead (inside the function that needs it, to keep an optional "
    "toolchain lazy), so the contracts in pyproject.toml [tool.importlinter] check it; if something outside "
    "Python's imports loads it by name (an entry point, vLLM), declare it in pyproject.toml and add it to "
    "ALLOWED in tests/test_string_imports.py with the reason"
)


@dataclass(frozen=True)
class Allowed:
    reason: str
    declared_by: str | None = None  # the pyproject.toml entry point (its "module:attr") that makes it necessary


ALLOWED = {
    "vllm_omni.edge": Allowed(
        "the rknn builder runs `python -m vllm_omni.edge rknn-convert` in the converter venv (rknn-toolkit2 cannot "
        "share a venv with torch): a process boundary, not an import; the command is the declared script",
        declared_by="vllm_omni.edge.cli.main:main",
    ),
    "vllm_omni.model_executor.models.qwen3_tts.modeling_qwen3_tts_talker:Qwen3TTSTalkerForCodecFrames": Allowed(
        "vLLM's ModelRegistry takes the talker as 'module:Class' and imports it in the engine process only; the "
        "plugin that registers it (vllm_omni/plugins.py) runs in every vLLM process, where torch and CUDA "
        "must not be imported yet",
        declared_by="vllm_omni.plugins:register",
    ),
    "vllm_omni.model_executor.models.qwen3_tts.logits_processor:Qwen3TTSLogitsProcessor": Allowed(
        "vLLM takes logits processors by qualified name (logits_processors=[...] in the engine arguments, "
        "model_executor/models/qwen3_tts/engine_contract.py) and imports them in its worker process; "
        "engine_settings adds it to every talker engine"
    ),
    "vllm_omni.edge.backends": Allowed("the entry-point group plugin backends register in, not a module reference"),
    "vllm_omni.edge.builders": Allowed("the entry-point group plugin builders register in, not a module reference"),
    "vllm_omni.edge.hardware_classes": Allowed(
        "the entry-point group plugin hardware classes register in, not a module reference"
    ),
}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    named: str  # the string, or the call as written

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.named}"


def _string_statements(tree: ast.AST) -> set[int]:
    """The strings that are statements (docstrings, attribute docstrings): prose, not references."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _reference(node: ast.AST, prose: set[int]) -> str | None:
    """What ``node`` names a module by, as written: an import call, or a string that is (or starts) a path."""
    if isinstance(node, ast.Call):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        return ast.unparse(node) if name in IMPORT_CALLS else None
    if isinstance(node, ast.JoinedStr):
        first = node.values[0] if node.values else None
        starts_a_path = isinstance(first, ast.Constant) and DOTTED_PREFIX.fullmatch(str(first.value))
        return ast.unparse(node) if starts_a_path else None
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
        return node.value if DOTTED_PATH.fullmatch(node.value) else None
    return None


def named_in_strings(source: str, path: str) -> list[Finding]:
    """Import calls, and strings that are (or f-strings that start) a ``vllm_omni`` module path, in ``source``."""
    tree = ast.parse(source)
    prose = _string_statements(tree)
    found = [Finding(path, node.lineno, named) for node in ast.walk(tree) if (named := _reference(node, prose))]
    return sorted(found, key=lambda finding: finding.line)


def declared_entry_points(repo_root: Path) -> set[str]:
    """Every ``module:attr`` that pyproject.toml declares: [project.scripts] and [project.entry-points.*]."""
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    declared = set(project.get("scripts", {}).values())
    for group in project.get("entry-points", {}).values():
        declared |= set(group.values())
    return declared


def defines(repo_root: Path, target: str) -> bool:
    """Whether ``module[:attr]`` exists in this tree, read without importing it (it may need vLLM or a GPU)."""
    module, _, attribute = target.partition(":")
    base = repo_root.joinpath(*module.split("."))
    path = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
    if path is None or not attribute:
        return path is not None
    tree = ast.parse(path.read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    return attribute.split(".")[0] in names


def source_findings(repo_root: Path) -> list[Finding]:
    found = []
    for path in sorted((repo_root / "vllm_omni").rglob("*.py")):
        found += named_in_strings(path.read_text(), str(path.relative_to(repo_root)))
    return found


def test_no_module_is_named_in_a_string_unless_allowed_with_a_reason(repo_root):
    unexplained = [f for f in source_findings(repo_root) if f.named not in ALLOWED]
    assert not unexplained, (
        "modules named in strings, which lint-imports cannot see:\n"
        + "\n".join(f"  {finding}" for finding in unexplained)
        + f"\nFix: {HOW_TO_FIX}"
    )


def test_every_allowed_name_is_still_used_exists_and_is_declared(repo_root):
    used = {finding.named for finding in source_findings(repo_root)}
    declared = declared_entry_points(repo_root)
    problems = []
    for named, allowed in ALLOWED.items():
        if named not in used:
            problems.append(f"{named!r} is named nowhere in vllm_omni/ any more: remove it from ALLOWED")
        if allowed.declared_by is None:
            continue
        if allowed.declared_by not in declared:
            problems.append(f"{named!r} is allowed for the entry point {allowed.declared_by!r}, which pyproject.toml "
                            "does not declare")  # fmt: skip
        if not defines(repo_root, named):
            problems.append(f"{named!r} names no module or attribute in this tree: update ALLOWED and the code")
    assert not problems, "\n".join(problems)


def test_the_scan_finds_each_way_of_naming_a_module_and_not_prose():
    source = '''"""Docs may say vllm_omni.edge.builders.windowed.build."""
import importlib
BUILDER = "vllm_omni.edge.builders.windowed.build"
PACKAGE = "vllm_omni.edge.builders"
module = importlib.import_module("vllm_omni.edge.builders.plans")
other = __import__("executorch")
built = f"vllm_omni.edge.builders.{BUILDER}"
MESSAGE = "decode with the stream decoder (vllm_omni.edge.runtime) instead"
PROG = "python -m vllm_omni.edge client"
'''
    found = [(f.line, f.named) for f in named_in_strings(source, "probe.py")]
    assert sorted(found) == [
        (3, "vllm_omni.edge.builders.windowed.build"),
        (4, "vllm_omni.edge.builders"),
        (5, "importlib.import_module('vllm_omni.edge.builders.plans')"),
        (5, "vllm_omni.edge.builders.plans"),
        (6, "__import__('executorch')"),
        (7, "f'vllm_omni.edge.builders.{BUILDER}'"),
    ]
