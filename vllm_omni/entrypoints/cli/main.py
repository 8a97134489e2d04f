"""Entry point of ``vllm serve MODEL --omni ...`` (and of the ``vllm-omni`` console script).

vLLM's own ``vllm`` command hands any command line holding ``--omni`` to :func:`main` before it
parses anything. Only ``serve`` is taken over: vLLM's serve subcommand with all its flags,
``validate`` and ``cmd``, plus the edge options of :mod:`.serve`.
"""

from __future__ import annotations

import sys


def _cli_env_setup() -> None:
    try:  # vLLM 0.33
        from vllm.entrypoints.common.startup import cli_env_setup
    except ImportError:  # vLLM 0.32
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    cli_env_setup()


def main(argv: list[str] | None = None) -> None:
    args_in = [arg for arg in (sys.argv[1:] if argv is None else argv) if arg != "--omni"]
    if args_in[:1] != ["serve"]:
        print("error: --omni runs `vllm serve MODEL --omni [--edge-hardware CLASS,...]`; other commands: drop --omni")
        raise SystemExit(2)

    from vllm.entrypoints.cli.serve import ServeSubcommand  # noqa: F401 (vLLM's parser module, imported for its side effects)
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from .serve import OmniServeSubcommand

    _cli_env_setup()
    parser = FlexibleArgumentParser(description="vLLM-Omni: vllm serve with the Qwen3-TTS talker and edge plans")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    command = OmniServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    args = parser.parse_args(args_in)
    from vllm.logger import configure_logging_from_args

    configure_logging_from_args(args)
    command.validate(args)
    args.dispatch_function(args)


if __name__ == "__main__":
    main()
