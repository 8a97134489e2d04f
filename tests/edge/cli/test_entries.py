"""Every command line answers: the one `vllm-omni-edge` command and each of its subcommands, and the `python -m`
entries the docs use (the mission's `python -m vllm_omni.edge.decoder_export` among them)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib

import pytest

PYTHON_M_ENTRIES = (
    ("vllm_omni.edge", "usage: vllm-omni-edge "),
    ("vllm_omni.edge.decoder_export", "usage: python -m vllm_omni.edge.decoder_export "),
    ("vllm_omni.testing.make_checkpoint", "--geometry {released,small}"),
)


def scripts(repo_root) -> dict[str, str]:
    """The edge's own scripts (``vllm-omni``, the serving entry, needs vLLM: tests/entrypoints covers it)."""
    entries = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["scripts"]
    return {name: target for name, target in entries.items() if name.startswith("vllm-omni-edge")}


SUBCOMMANDS = ("build", "plan", "hardware", "export", "client", "codec-stream", "rknn-convert")


def test_one_script_whose_every_subcommand_parses_help(repo_root, capsys):
    entries = scripts(repo_root)
    assert entries == {"vllm-omni-edge": "vllm_omni.edge.cli.main:main"}
    module_name, _, function = entries["vllm-omni-edge"].partition(":")
    main = getattr(importlib.import_module(module_name), function)
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    listed = capsys.readouterr().out
    assert exit_info.value.code == 0 and all(name in listed for name in SUBCOMMANDS), listed
    for name in SUBCOMMANDS:
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0, name
        assert capsys.readouterr().out.startswith(f"usage: vllm-omni-edge {name} "), name


def test_a_subcommand_with_its_own_parser_returns_its_usage_error(capsys):
    from vllm_omni.edge.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["codec-stream", "record", "--codes"])
    assert exit_info.value.code == 2
    assert "usage: vllm-omni-edge codec-stream record" in capsys.readouterr().err


@pytest.mark.parametrize(("module", "usage"), PYTHON_M_ENTRIES)
def test_python_m_entries_still_answer(repo_root, module, usage):
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=repo_root, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert usage in result.stdout
