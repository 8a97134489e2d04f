"""The browser class's JavaScript modules (web/edge/) pass their Node tests against fixtures made here by the
Python implementation: the wire protocol parser (golden and hostile streams), the stateful decoder in
onnxruntime-web (>= 100 dB against the Python full decode) and the plan loader (sha256 checks)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.web.make_fixtures import write_fixtures

REPO = Path(__file__).resolve().parents[2]
WEB = REPO / "web"


def node_and_packages() -> str:
    """Node, with web/'s packages installed (``make test`` runs ``make setup-web`` first: never a skip)."""
    node = shutil.which("node")
    assert node is not None, "node is not on PATH: install Node.js 20 (the machine image has it)"
    assert (WEB / "node_modules" / "onnxruntime-web" / "package.json").is_file(), (
        "web/node_modules/onnxruntime-web is missing: run `make setup-web`"
    )
    return node


def test_the_javascript_edge_modules_pass_their_node_tests_against_python_fixtures(tmp_path, small_checkpoint):
    node = node_and_packages()
    fixtures = write_fixtures(tmp_path / "fixtures", checkpoint=small_checkpoint)
    run = subprocess.run(
        [node, "--test", "web/edge/test/"],
        cwd=REPO,
        env={**os.environ, "EDGE_WEB_FIXTURES": str(fixtures)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-20000:]
    assert "# fail 0" in output and "vs full decode" in output, output[-5000:]


def js_constant(module: str, name: str) -> str:
    """The value of ``export const NAME = "...";`` in ``web/edge/MODULE``."""
    match = re.search(rf'^export const {name} = "([^"]*)";', (WEB / "edge" / module).read_text(), re.MULTILINE)
    assert match, f"web/edge/{module} has no string constant {name}"
    return match.group(1)


def test_the_page_and_the_python_side_write_each_shared_string_once_and_alike():
    """The protocol name (the WebSocket subprotocol too) and the socket's route: one constant per language, equal;
    the page holds no server's limits (it reads the announcement), and the Python client's fallback for a server
    older than the announcement is that server's defaults."""
    from vllm_omni.edge.client.text_socket import UNANNOUNCED_LIMITS
    from vllm_omni.edge.stream import PROTOCOL, SOCKET_PATH
    from vllm_omni.entrypoints.websocket.socket_auth import CODEC_SUBPROTOCOL
    from vllm_omni.entrypoints.websocket.socket_auth import SOCKET_PATH as AUTH_PATH

    assert js_constant("stream.mjs", "PROTOCOL") == PROTOCOL == CODEC_SUBPROTOCOL
    assert js_constant("stream.mjs", "SOCKET_PATH") == SOCKET_PATH == AUTH_PATH
    sources = {path: path.read_text() for path in (REPO / "web").glob("*/*.mjs")}
    sources |= {path: path.read_text() for path in (REPO / "vllm_omni").rglob("*.py")}
    for value in (PROTOCOL, SOCKET_PATH):  # defined (a name bound to the string) once per language
        defined = sorted(str(path.relative_to(REPO)) for path, text in sources.items() if f'= "{value}"' in text)
        assert defined == ["vllm_omni/edge/stream/messages.py", "web/edge/stream.mjs"], (value, defined)
    page = [path for path in (WEB / "page").glob("*.mjs")] + [path for path in (WEB / "edge").glob("*.mjs")]
    assert not [path.name for path in page if "max_input_chars: 4096" in path.read_text()]
    from vllm_omni.entrypoints.openai.speech_limits import SpeechLimits

    defaults = SpeechLimits()
    assert {key: getattr(defaults, key) for key in UNANNOUNCED_LIMITS.to_json()} == UNANNOUNCED_LIMITS.to_json()
