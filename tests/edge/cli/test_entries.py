"""Every command line answers: the [project.scripts] entry points and the `python -m` entries the docs use."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib

import pytest

PYTHON_M_ENTRIES = (
    ("vllm_omni.edge", "usage: python -m vllm_omni.edge "),
    ("vllm_omni.edge.decoder_export", "usage: python -m vllm_omni.edge.decoder_export "),
    ("vllm_omni.edge.client", "usage: python -m vllm_omni.edge.client "),
    ("vllm_omni.edge.codec_stream", "usage: python -m vllm_omni.edge.codec_stream "),
    ("vllm_omni.testing.make_checkpoint", "--geometry {released,small}"),
    ("vllm_omni.edge.cli.rknn_convert", "usage: python -m vllm_omni.edge.cli.rknn_convert "),
)


def scripts(repo_root) -> dict[str, str]:
    """The edge's own scripts (``vllm-omni``, the serving entry, needs vLLM: tests/entrypoints covers it)."""
    entries = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["scripts"]
    return {name: target for name, target in entries.items() if name.startswith("vllm-omni-edge")}


def test_every_script_entry_point_is_a_main_that_parses_help(repo_root, capsys):
    entries = scripts(repo_root)
    assert set(entries) == {
        "vllm-omni-edge",
        "vllm-omni-edge-export",
        "vllm-omni-edge-client",
        "vllm-omni-edge-codec-stream",
        "vllm-omni-edge-rknn-convert",
    }
    for name, target in entries.items():
        module_name, _, function = target.partition(":")
        main = getattr(importlib.import_module(module_name), function)
        with pytest.raises(SystemExit) as exit_info:
            main(["--help"])
        assert exit_info.value.code == 0, name
        assert capsys.readouterr().out.startswith("usage: "), name


@pytest.mark.parametrize(("module", "usage"), PYTHON_M_ENTRIES)
def test_python_m_entries_still_answer(repo_root, module, usage):
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=repo_root, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert usage in result.stdout
