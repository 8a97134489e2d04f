"""A subcommand of ``python -m vllm_omni.edge`` in vLLM's ``CLISubcommand`` shape: parse, then call one function."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


class CLISubcommand:
    """One subcommand: ``subparser_init`` adds its arguments, ``cmd`` runs it and returns the exit code.

    ``cmd`` may raise :class:`~vllm_omni.edge.errors.EdgeError`; :func:`.main.main` turns it into one
    ``error:`` line and exit code 1. Exit code 2 is for arguments that parse but cannot work together.
    """

    name: str
    help: str

    def add_parser(self, subparsers: argparse._SubParsersAction, commands: str | None = None) -> tuple:
        """This subcommand's parser, and (when ``commands`` names the dest) its own sub-subcommands."""
        parser = subparsers.add_parser(self.name, help=self.help)
        return parser, (parser.add_subparsers(dest=commands, required=True) if commands else None)

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        raise NotImplementedError

    def cmd(self, args: argparse.Namespace) -> int:
        raise NotImplementedError


def add_checkpoint_argument(parser: argparse.ArgumentParser, flag: str, what: str) -> None:
    """``flag`` naming the checkpoint (``what`` it may be), defaulting to ``$QWEN3_TTS_MODEL``."""
    parser.add_argument(flag, default=os.environ.get("QWEN3_TTS_MODEL"), help=f"{what} (default: $QWEN3_TTS_MODEL)")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a bad value is a usage error, exit code 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, found {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, found {value}")
    return value


def same_file(first: os.PathLike[str] | str, second: os.PathLike[str] | str) -> bool:
    """Whether two paths name one file (or would: the same resolved path)."""
    first, second = Path(first), Path(second)
    try:
        if first.exists() and second.exists():
            return first.samefile(second)
        return first.resolve() == second.resolve()
    except OSError:
        return False
