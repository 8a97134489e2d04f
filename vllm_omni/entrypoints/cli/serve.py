"""``vllm serve MODEL --omni --edge-hardware CLASS[,CLASS...] [--edge-artifacts DIR]``.

vLLM's serve subcommand (every flag of it, its ``validate`` and ``cmd``: headless and several API
servers keep working), plus:

* the talker's engine settings (its logits processor, no prefix caching, prompts as ids, the v1
  model runner), set unless the user set them; the model refuses contradicting ones at start-up;
* a local checkpoint served under its directory's name unless ``--served-model-name`` is given (no server path in
  metrics labels), its path still accepted;
* a planned shutdown drains: vLLM's ``--shutdown-timeout`` is :data:`DEFAULT_SHUTDOWN_TIMEOUT_S` unless given, and
  an engine that died unasked ends the command with exit code 1 (:mod:`..server.lifecycle`);
* ``--edge-hardware``: classes to publish plans for, checked against the registry;
* ``--edge-artifacts``: one plan directory per class, validated or built from the served model's
  ``speech_tokenizer/`` before the engine starts (progress lines on stderr; resumable);
* the endpoint plugin (``vllm_omni.entrypoints.routes.edge_routes``) allow-listed in ``VLLM_PLUGINS``
  together with the talker's general plugin, so the hand-off itself enables the routes (the user's other
  plugins keep loading: :func:`allow_plugins`);
* the WebSocket's subprotocol API key (:mod:`..websocket.socket_auth`) as vLLM's ``--middleware``, which wraps the
  app outside vLLM's ``--api-key`` check;
* with ``browser`` among the classes, the page's files (:mod:`..browser.browser_page`) checked before anything starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vllm.entrypoints.cli.serve import ServeSubcommand

from vllm_omni.edge.progress import progress_printer
from vllm_omni.entrypoints.openai.speech_limits import SpeechLimits, add_limit_arguments
from vllm_omni.entrypoints.server.lifecycle import LIFECYCLE
from vllm_omni.entrypoints.server.request_guard import site_policy
from vllm_omni.entrypoints.websocket.socket_auth import MIDDLEWARE as SOCKET_AUTH_MIDDLEWARE
from vllm_omni.model_executor.models.qwen3_tts.engine_settings import SETTING_NAMES, talker_engine_args

GENERAL_PLUGIN = "qwen3_tts_talker"
ENDPOINT_PLUGIN = "vllm_omni_edge"
DEFAULT_ARTIFACTS = Path("edge-artifacts")


say = progress_printer("vllm-omni")


ENDPOINT_PLUGINS_GROUP = "vllm.endpoint_plugins"


def installed_plugins() -> list[str]:
    """The plugins vLLM loads when ``VLLM_PLUGINS`` is unset: every installed entry point of its plugin groups
    (``vllm.*_plugins``) but the endpoint plugins, which vLLM loads only when they are named."""
    from importlib.metadata import entry_points

    found = entry_points()
    groups = [
        g for g in found.groups if g.startswith("vllm.") and g.endswith("_plugins") and g != ENDPOINT_PLUGINS_GROUP
    ]
    return [plugin.name for group in sorted(groups) for plugin in found.select(group=group)]


def allow_plugins(*names: str) -> None:
    """Add ``names`` to ``VLLM_PLUGINS``. Once set it is an allow-list for every plugin group, so when the user
    left it unset it starts as every plugin vLLM would have loaded (:func:`installed_plugins`): naming ours never
    switches another plugin off. A user's own list is kept as given, ours added."""
    if "VLLM_PLUGINS" in os.environ:
        current = [n.strip() for n in os.environ["VLLM_PLUGINS"].split(",") if n.strip()]
    else:
        current = installed_plugins()
    os.environ["VLLM_PLUGINS"] = ",".join(dict.fromkeys([*current, *names]))


def apply_talker_engine_settings(args: argparse.Namespace, argv: list[str] | None = None) -> None:
    """The talker's engine settings (:mod:`...engine_settings`), where the command line (``argv``, by default this
    process's) left vLLM's defaults. ``enforce_eager`` is given when true or when ``--no-enforce-eager`` is on the
    command line (the parser's default, False, says neither)."""
    given = {name: getattr(args, name, None) for name in SETTING_NAMES}
    if not given["enforce_eager"] and "--no-enforce-eager" not in (sys.argv if argv is None else argv):
        del given["enforce_eager"]
    for name, value in talker_engine_args(given).items():
        setattr(args, name, value)


DEFAULT_SHUTDOWN_TIMEOUT_S = 25  # a typical utterance, inside Kubernetes' default 30 s grace period


def drain_by_default(args: argparse.Namespace, argv: list[str] | None = None) -> None:
    """vLLM's ``--shutdown-timeout`` (its default 0 aborts every request at SIGTERM) set to
    :data:`DEFAULT_SHUTDOWN_TIMEOUT_S` unless the command line (``argv``, by default this process's) gave one: a
    planned shutdown lets the utterances in flight finish."""
    given = sys.argv if argv is None else argv
    if not any(arg == "--shutdown-timeout" or arg.startswith("--shutdown-timeout=") for arg in given):
        args.shutdown_timeout = DEFAULT_SHUTDOWN_TIMEOUT_S


def name_a_local_model(args: argparse.Namespace, model: str) -> None:
    """Without ``--served-model-name``, a checkpoint in a local directory is served as the directory's name first
    (vLLM's metrics labels and answers name the model by the first served name: no path of this server in them),
    its path as given still accepted in a request's ``model``."""
    if not getattr(args, "served_model_name", None) and Path(model).is_dir():
        args.served_model_name = [Path(model).resolve().name, model]


class OmniServeSubcommand(ServeSubcommand):
    """vLLM's ``serve`` with the talker's settings and the edge plans."""

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        parser = super().subparser_init(subparsers)
        edge = parser.add_argument_group("vLLM-Omni edge")
        edge.add_argument(
            "--edge-hardware",
            default=None,
            help="hardware classes to publish execution plans for, comma-separated (npu_phone, rockchip_npu, "
            "cpu_x86_64, cpu_arm64, browser: also serves the page at /edge/browser/; `python -m vllm_omni.edge "
            "hardware list`)",
        )
        edge.add_argument(
            "--edge-artifacts",
            type=Path,
            default=DEFAULT_ARTIFACTS,
            help="directory of the plans, one folder per class; missing plans are built at start-up",
        )
        add_limit_arguments(parser.add_argument_group("vLLM-Omni speech limits (per request and WebSocket)"))
        return parser

    def validate(self, args: argparse.Namespace) -> None:
        super().validate(args)
        from vllm_omni.edge.errors import EdgeError

        from ..plans.edge_plans import parse_classes

        try:
            args.edge_classes = parse_classes(args.edge_hardware) if args.edge_hardware else []
        except EdgeError as error:
            print(f"error: --edge-hardware: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        if "browser" in args.edge_classes:
            from ..browser.browser_page import BrowserPage

            try:
                BrowserPage.find()
            except EdgeError as error:
                print(f"error: --edge-hardware browser: {error}", file=sys.stderr)
                raise SystemExit(2) from None
        try:
            SpeechLimits.from_args(args)
        except ValueError as error:
            print(f"error: --speech-*: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        try:
            site_policy(args)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2) from None

    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        from vllm_omni.edge.errors import EdgeError

        from .plan_builds import prepare_plans

        model = getattr(args, "model_tag", None) or args.model
        apply_talker_engine_settings(args)
        name_a_local_model(args, model)
        drain_by_default(args)
        allow_plugins(GENERAL_PLUGIN, ENDPOINT_PLUGIN)
        args.middleware = [*(args.middleware or []), SOCKET_AUTH_MIDDLEWARE]
        try:
            plans = prepare_plans(model, args.edge_classes, args.edge_artifacts, progress=say)
        except EdgeError as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(1) from None
        say(
            "publishing "
            + (", ".join(f"{name} ({plan.plan_id[:12]})" for name, plan in plans.published.items()) or "no plans")
            + f"; server-side PCM through {plans.server_decoder.hardware_class}"
        )
        try:
            ServeSubcommand.cmd(args)
        except RuntimeError as error:  # vLLM's launcher of several API servers: a process died
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(1) from None
        if LIFECYCLE.engine_failure is not None:  # one API server in this process: its engine died unasked
            print(f"error: {LIFECYCLE.engine_failure}", file=sys.stderr)
            raise SystemExit(1)
