"""The ``browser`` hardware class end to end: a loopback ``vllm serve --omni --edge-hardware browser`` serves the
page, and Debian's headless Chromium (``make setup-browser``) decodes the codec stream in onnxruntime-web.

The page's test hook (``window.edgeTest``, ``web/page/app.mjs``; installed by ``#edge_test=1`` in the address)
returns what it received and decoded; its PCM must equal the full decode of the same frames in Python (>= 100 dB)
for two utterances and a cancelled one. The API key travels in no URL: the page takes it from the address's
fragment, and the key is in no server log line, URL, Referer or response header of the page's requests; the page
holds a bounded amount of audio however long it speaks.
Hostile input shows on the page and leaves it usable: a wrong key, an artifact that no longer matches the plan's
sha256, and recordings a server never sends (a sequence gap, a cut-off stream) fed through ``playRecording``,
the WebSocket's code path from the parser on.
Every wait is bounded: a page that never gets ready or a speak that never returns fails the test.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from vllm_omni.edge.audio import snr_db
from vllm_omni.entrypoints.browser.browser_page import ISOLATION_HEADERS, WEB_DIR_ENV, BrowserPage, web_dir
from vllm_omni.entrypoints.websocket.socket_auth import CODEC_SUBPROTOCOL
from vllm_omni.testing.browser import open_headless_chromium, run_in_page

from ..serving import KEY, as_recording, bearer, running_server

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)

SCREENSHOT_ENV = "EDGE_BROWSER_SCREENSHOT"  # a path the page's screenshot is copied to as well
PAGE_LOAD_S = 60  # the page, then its hook's `ready` (plan fetched and verified, the session created)
SPEAK_S = 180  # one utterance: generation on the tiny talker plus decoding in WASM
MIN_SNR_DB = 100.0
# Short utterances: the random talker rarely stops by itself, so the model length bounds each one.
SERVE_ARGS = ["--max-model-len", "160"]
UTTERANCES = (("Hello there, this is a test.", "Ryan"), ("Good morning, how are you?", "Vivian"))
TEST_HOOK = "edge_test=1"  # the page installs window.edgeTest only when its address's fragment asks
PAGE_CAPTURE_FRAMES = 512  # app.mjs CAPTURE_FRAMES: the frames (and their PCM) an utterance keeps for a test
PAGE_MEASURE_FRAMES = 24  # app.mjs MEASURE_FRAMES: the frames a page decodes before it judges its speed
NEVER = 1e9  # a hand-over bar no decode passes: the page decodes every frame itself
HANDS_OFF = {"handoverRtf": NEVER, "loadHandoverRtf": NEVER}
WEBGPU_LOAD_S = 180  # a plan on SwiftShader: the session, a verbose placement log, shaders compiled for both steps
# SwiftShader's WebGPU against the full decode: 127.8 dB measured at the small geometry (WASM: 110-129 dB). The graph
# has no sin or cos op (web_layout.py), so a GPU's loose builtins do not enter: WASM's bar, far above the issue's 60 dB.
MIN_WEBGPU_SNR_DB = MIN_SNR_DB


def page_url(server) -> str:
    """The page with the key in its fragment (never sent to the server) and the test hook."""
    return f"{server.url}/edge/browser/#api_key={urllib.parse.quote(KEY)}&{TEST_HOOK}"


def assert_page_headers(path: str, headers: dict[str, str]) -> None:
    """The headers every answer of the page's routes carries: isolation, no referrer, the same-origin CSP."""
    headers = {name.lower(): value for name, value in headers.items()}
    for name, value in ISOLATION_HEADERS.items():
        assert headers.get(name.lower()) == value, (path, name, headers)
    assert headers.get("referrer-policy") == "no-referrer", (path, headers)
    policy = [d.strip() for d in headers.get("content-security-policy", "").split(";")]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy, (path, policy)
    assert "script-src 'self' 'wasm-unsafe-eval'" in policy and "object-src 'none'" in policy, (path, policy)
    connect = next(d for d in policy if d.startswith("connect-src "))
    assert connect.split()[1] == "'self'" and all(s.startswith(("ws://", "wss://")) for s in connect.split()[2:])


@pytest.fixture(scope="module")
def server(talker_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, shared_plans):
    work = tmp_path_factory.mktemp("browser-serve")
    for name in ("browser", "cpu_x86_64"):  # kept from an earlier run when they validate, built at start otherwise
        shared_plans.copy_to(talker_checkpoint, name, work / "artifacts" / name)
    with running_server(talker_checkpoint, work, "browser", SERVE_ARGS) as server:
        for name in ("browser", "cpu_x86_64"):
            shared_plans.publish(talker_checkpoint, name, work / "artifacts" / name)
        yield server


def fetch(server, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """``path`` sent as written (no normalisation of ``..``), no API key: status, headers, body."""
    url = urllib.parse.urlsplit(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_the_page_and_its_runtime_are_served_with_isolation_headers(server):
    web = web_dir()  # the checkout's web/ (what the server serves; $VLLM_OMNI_WEB_DIR overrides both)
    page = BrowserPage.find(web)
    module = next(name for name in page.files if name.startswith("edge/"))
    wasm = next(name for name in page.files if name.endswith(".wasm"))
    expected = {
        "/edge/browser/": (web / "page" / "index.html", "text/html"),
        "/edge/browser/index.html": (web / "page" / "index.html", "text/html"),
        f"/edge/browser/{module}": (web / module, "text/javascript"),
        "/edge/browser/ort/ort.wasm.min.mjs": (
            web / "node_modules/onnxruntime-web/dist/ort.wasm.min.mjs",
            "text/javascript",
        ),
        f"/edge/browser/{wasm}": (web / "node_modules/onnxruntime-web/dist" / wasm.removeprefix("ort/"), None),
    }
    for path, (file, kind) in expected.items():
        status, headers, body = fetch(server, path)  # public: no API key
        assert status == 200, (path, status, body[:200])
        assert body == file.read_bytes(), path
        assert headers["content-type"].startswith(kind or "application/wasm"), (path, headers["content-type"])
        assert_page_headers(path, headers)
    status, headers, body = fetch(server, f"/edge/browser/{wasm}", "HEAD")
    assert (status, body, int(headers["content-length"])) == (200, b"", page.files[wasm].stat().st_size)
    assert_page_headers("HEAD", headers)
    status, headers, _ = fetch(server, "/edge/browser/no-such-file.html")
    assert status == 404
    assert_page_headers("404", headers)
    # The page's relative URLs need the slash; the query is not carried on: a key put there is not sent again.
    for path in ("/edge/browser?api_key=abc", "/edge/browser?threads=2&api_key=abc", "/edge/browser"):
        status, headers, _ = fetch(server, path)
        assert (status, headers["location"]) == (308, "/edge/browser/"), (path, headers)
        assert_page_headers(path, headers)


def test_only_the_page_files_are_served(server, repo_root):
    for path in (
        "/edge/browser/../../pyproject.toml",
        "/edge/browser/%2e%2e/%2e%2e/pyproject.toml",
        "/edge/browser/ort/../package.json",
        "/edge/browser/ort/%2E%2E/package.json",
        "/edge/browser/edge/../../package.json",
        "/edge/browser//etc/passwd",
        "/edge/browser/ort/../../../../../../etc/passwd",
        "/edge/browser/no-such-file.html",
        "/edge/browser/edge/no-such-module.mjs",
        "/edge/browser/package-lock.json",
    ):
        status, _, body = fetch(server, path)
        assert status == 404, (path, status)
        assert b"[tool." not in body and b"root:" not in body and b'"dependencies"' not in body, path
    assert (repo_root / "pyproject.toml").is_file()  # the files those paths aimed at exist


def socket_session(server, subprotocols: list[str], messages: list[dict]):
    """``messages`` over /v1/audio/speech/stream offering ``subprotocols`` (no Authorization header): the
    subprotocol the server chose, the messages received, the close code."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    received: list = []
    with connect(url, subprotocols=subprotocols, open_timeout=60) as socket:
        for message in messages:
            socket.send(json.dumps(message))
        try:
            while True:
                received.append(socket.recv(timeout=120))
        except ConnectionClosed:
            pass
        return socket.subprotocol, received, socket.close_code


def test_a_browser_socket_sends_its_key_as_a_subprotocol(server):
    from websockets.exceptions import InvalidStatus

    start = {"type": "start", "input": "Hello.", "voice": "Ryan", "edge_hardware": "browser", "greedy": True}
    chosen, messages, code = socket_session(
        server, [CODEC_SUBPROTOCOL, bearer(KEY)], [{**start, "max_frames": 4}, {"type": "end"}]
    )
    assert (chosen, code) == (CODEC_SUBPROTOCOL, 1000)
    frames = sum(len(event.frames) for event in as_recording(messages) if hasattr(event, "frames"))
    assert frames == 4
    for offered in ([CODEC_SUBPROTOCOL, bearer("wrong")], [CODEC_SUBPROTOCOL], [CODEC_SUBPROTOCOL, "bearer.%%%"]):
        with pytest.raises(InvalidStatus) as refused:
            socket_session(server, offered, [start])
        assert refused.value.response.status_code == 401, offered


def test_start_without_the_page_files_stops_in_one_line(talker_checkpoint, tmp_path):
    vllm = Path(sys.executable).parent / "vllm"
    command = [str(vllm), "serve", str(talker_checkpoint), "--omni", "--edge-hardware", "browser"]
    command += ["--edge-artifacts", str(tmp_path / "artifacts")]
    env = {**os.environ, WEB_DIR_ENV: str(tmp_path / "web")}
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 2, run.stderr[-3000:]
    assert len(errors) == 1 and "make setup-web" in errors[0] and str(tmp_path / "web") in errors[0], run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "artifacts").exists()  # nothing built


# -- the page in headless Chromium ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(server, tmp_path_factory: pytest.TempPathFactory):
    """Headless Chromium on the served page (``#api_key=KEY&edge_test=1``), once its hook is ready."""
    log = tmp_path_factory.mktemp("chromedriver") / "chromedriver.log"
    profile = tmp_path_factory.mktemp("chromium-profile")
    driver = open_headless_chromium(profile, log_path=log, console_log=True, software_webgpu=True)
    try:
        driver.set_page_load_timeout(PAGE_LOAD_S)
        open_page(driver, page_url(server))
        yield driver
    finally:
        driver.quit()


def open_page(driver, url: str) -> None:
    """``url`` (the key in its fragment), once the page's hook is ready and its status shows no error."""
    driver.get(url)
    ready = call(driver, "await window.edgeTest.ready; return true;", timeout=PAGE_LOAD_S, wait_for_hook=True)
    assert ready is True, f"the page's edgeTest.ready failed: {ready}\n{console(driver)}"
    # the tests check the page's own decode: no hand-over unless one asks (a loaded test machine is slow)
    call(driver, "window.edgeTest.setHandover(args[0]); return true;", HANDS_OFF, timeout=10)
    shown = status_text(driver)
    assert "error" not in status_class(driver), (
        f"the page opened with #api_key=KEY is not ready: #status says {shown!r}\n{console(driver)}"
    )


def call(driver, body: str, *args, timeout: float, wait_for_hook: bool = False):
    """Run ``body`` (an async function's body; ``args`` as ``args``) in the page, at most ``timeout`` s; a
    rejection comes back as ``{"thrown": message}``."""
    from selenium.common.exceptions import TimeoutException

    try:
        return run_in_page(driver, body, *args, timeout=timeout, wait_for_hook=wait_for_hook)
    except TimeoutException:
        pytest.fail(f"the page did not answer in {timeout} s: {body.strip()[:120]}\n{console(driver)}")


def console(driver) -> str:
    try:
        return "\n".join(f"{entry['level']}: {entry['message']}" for entry in driver.get_log("browser")[-40:])
    except Exception as error:  # the log is a diagnostic: its absence must not hide the failure itself
        return f"(no browser log: {error})"


def speak(
    driver,
    text: str,
    voice: str,
    cancel_after_frames: int | None = None,
    handover_rtf: float = NEVER,
    load_handover_rtf: float = NEVER,
) -> dict:
    """``edgeTest.speak``; the page hands over to the server's audio only where a test asks (a loaded test machine
    may decode slower than real time, and these tests check the page's own decode)."""
    body = (
        "const options = {voice: args[1], handoverRtf: args[3], loadHandoverRtf: args[4]};\n"
        "if (args[2] !== null) options.cancelAfterFrames = args[2];\n"
        "return await window.edgeTest.speak(args[0], options);"
    )
    result = call(driver, body, text, voice, cancel_after_frames, handover_rtf, load_handover_rtf, timeout=SPEAK_S)
    assert isinstance(result, dict) and "thrown" not in result, f"speak threw: {result}\n{console(driver)}"
    return result


def status_text(driver) -> str:
    return driver.execute_script("const s = document.querySelector('#status'); return s ? s.textContent : null;")


@pytest.fixture(scope="module")
def full_decode(talker_checkpoint: Path):
    """frames [T, Q] -> the full decode of the checkpoint's decoder in Python (float32 samples)."""
    import torch

    from vllm_omni.edge.checkpoint import load_code2wav_decoder

    decoder = load_code2wav_decoder(talker_checkpoint)

    def decode(frames: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return decoder(torch.from_numpy(frames).T[None]).numpy().ravel()

    return decode


def assert_decodes_exactly(result: dict, full_decode, label: str, min_snr_db: float = MIN_SNR_DB) -> float:
    """The page's PCM of ``result`` against the full decode of its frames; the SNR in dB."""
    assert not result.get("error"), f"{label}: {result.get('error')}"
    assert result["captureComplete"] and result["frameCount"] == len(result["frames"]), (label, result["frameCount"])
    frames = np.asarray(result["frames"], dtype=np.int64)
    assert frames.ndim == 2 and frames.shape[0] > 0 and frames.shape[1] == 16, (label, frames.shape)
    pcm = np.asarray(result["pcm"], dtype=np.float32)
    reference = full_decode(frames)  # samples per frame: the checkpoint's (small geometry here, not 1920)
    assert pcm.size == reference.size, (label, pcm.size, reference.size, frames.shape)
    snr = snr_db(reference, pcm)
    assert snr >= min_snr_db, f"{label}: the page's audio is {snr:.1f} dB from the full decode"
    assert result["firstAudioSeconds"] > 0 and result["rtf"] > 0 and result["bytes"] > 0, (label, result)
    return snr


def test_the_page_decodes_what_python_decodes(browser, full_decode, tmp_path):
    results = [speak(browser, text, voice) for text, voice in UTTERANCES]
    cancelled = speak(browser, UTTERANCES[0][0], UTTERANCES[0][1], cancel_after_frames=6)
    snrs = [assert_decodes_exactly(r, full_decode, f"utterance {i}") for i, r in enumerate(results)]
    snrs.append(assert_decodes_exactly(cancelled, full_decode, "cancelled"))
    assert all(r["doneReason"] != "cancelled" for r in results), [r["doneReason"] for r in results]
    assert cancelled["doneReason"] == "cancelled" and len(cancelled["frames"]) >= 6
    assert results[0]["frames"] != results[1]["frames"]  # two utterances, not one stream twice
    print(f"page vs full decode: {', '.join(f'{s:.1f}' for s in snrs)} dB; first audio "
          f"{[round(r['firstAudioSeconds'], 3) for r in (*results, cancelled)]} s, "
          f"RTF {[round(r['rtf'], 3) for r in results]}, plan {results[0].get('planSeconds')} s")  # fmt: skip
    screenshot = tmp_path / "browser.png"
    assert browser.save_screenshot(str(screenshot)) and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copyfile(screenshot, os.environ[SCREENSHOT_ENV])


def reload_plan(driver, timeout: float = PAGE_LOAD_S, **options) -> dict:
    """``edgeTest.reloadPlan(options)``: the plan and a fresh decoder worker with them; what the worker reports."""
    loaded = call(driver, "return await window.edgeTest.reloadPlan(args[0]);", options, timeout=timeout)
    assert isinstance(loaded, dict) and not loaded.get("error") and "thrown" not in loaded, (
        f"reloadPlan({options}) failed: {loaded}\n{console(driver)}"
    )
    return loaded


def test_the_page_decodes_on_webgpu_exactly_with_only_shape_arithmetic_off_the_gpu(browser, server, full_decode):
    """SwiftShader's WebGPU adapter (no GPU here): the software adapter is refused unless asked for, then decodes
    exactly, and onnxruntime places every node of the step on WebGPU but the shape arithmetic of the symbolic B."""
    from vllm_omni.edge.backends.onnx.graph import shape_nodes
    from vllm_omni.edge.plan.model import ExecPlan

    auto = reload_plan(browser)
    assert auto["provider"] == "wasm" and "software (swiftshader)" in auto["fallback"], auto
    assert "WASM" in browser.find_element("id", "details").text
    try:
        loaded = reload_plan(browser, WEBGPU_LOAD_S, provider="webgpu", softwareAdapter=True, placement=True)
        assert loaded["provider"] == "webgpu" and loaded["adapter"]["architecture"] == "swiftshader", loaded
        assert "WebGPU (google swiftshader)" in browser.find_element("id", "details").text
        plan = ExecPlan.load(server.artifacts / "browser", check_sha256=False)
        graph = plan.path("main")
        placement = loaded["placement"]
        on_cpu = {name for _op, name in placement.get("CPUExecutionProvider", [])}
        on_gpu = placement["WebGpuExecutionProvider"]
        assert set(placement) <= {"WebGpuExecutionProvider", "CPUExecutionProvider"}, set(placement)
        # onnxruntime folds some shape nodes and fuses others after reading the file: those it places on the CPU are
        # a subset of the file's shape arithmetic, and every other node (each float or int32 op) is on WebGPU
        shapes = shape_nodes(graph)
        assert on_cpu <= shapes, f"off WebGPU but not shape arithmetic: {sorted(on_cpu - shapes)}"
        assert len(on_gpu) > 10 * len(on_cpu), placement
        result = speak(browser, *UTTERANCES[0])
        snr = assert_decodes_exactly(result, full_decode, "WebGPU (SwiftShader)", MIN_WEBGPU_SNR_DB)
        print(
            f"WebGPU (SwiftShader) vs full decode: {snr:.1f} dB; nodes on WebGPU "
            f"{len(on_gpu)}, on the CPU {len(on_cpu)} (shape arithmetic); load "
            f"{loaded['planSeconds']:.1f} s (warm-up {loaded['warmSeconds']:.1f} s), RTF {result['rtf']:.2f}"
        )
    finally:
        reload_plan(browser, provider="auto", softwareAdapter=False)


def test_a_page_too_slow_for_real_time_hands_over_to_the_servers_audio_without_a_gap(browser, server, full_decode):
    """A page forced slow (``handoverRtf: 0``: any decode is too slow) switches to the server's audio after its
    measuring frames: every sample is there once (frames x samples per frame), the page's part is its own exact
    decode, the server's part is the server decoder's bit for bit, and the seam is as exact as the rest."""
    from vllm_omni.edge.plan.model import ExecPlan
    from vllm_omni.edge.runtime import open_decoder

    result = speak(browser, *UTTERANCES[1], handover_rtf=0)  # judged on its first frames, not at load
    handover = result["handover"]
    assert not result.get("error") and handover is not None, result.get("error") or "no hand-over"
    frames = np.asarray(result["frames"], dtype=np.int64)
    pcm = np.asarray(result["pcm"], dtype=np.float32)
    server_plan = ExecPlan.load(server.artifacts / "cpu_x86_64", check_sha256=False)
    per_frame = server_plan.codec.samples_per_frame
    switch = handover["fromFrame"] * per_frame
    assert result["captureComplete"] and handover["fromFrame"] >= PAGE_MEASURE_FRAMES, handover
    assert pcm.size == frames.shape[0] * per_frame == result["sampleCount"], (pcm.size, frames.shape)
    assert handover["serverSamples"] == pcm.size - switch > 0, (handover, pcm.size, switch)
    decoder = open_decoder(server_plan)
    served = np.concatenate([decoder.feed(frames), decoder.flush()])
    assert np.array_equal(pcm[switch:], served[switch:]), "the played server audio is not the server's decode"
    reference = full_decode(frames)
    seam = slice(switch - 4 * per_frame, switch + 4 * per_frame)
    snrs = [snr_db(reference[part], pcm[part]) for part in (slice(0, switch), seam, slice(switch, None))]
    assert min(snrs) >= MIN_SNR_DB, f"page part, seam, server part: {snrs} dB"
    assert "then by the server" in status_text(browser), status_text(browser)

    # too slow already at load (its timed warm-up step): the server's audio from the first frame
    whole = speak(browser, *UTTERANCES[0], load_handover_rtf=0)
    assert not whole.get("error") and whole["handover"]["fromFrame"] == 0, whole.get("error") or whole["handover"]
    frames_all = np.asarray(whole["frames"], dtype=np.int64)
    decoder = open_decoder(server_plan)
    served_all = np.concatenate([decoder.feed(frames_all), decoder.flush()])
    assert np.array_equal(np.asarray(whole["pcm"], dtype=np.float32), served_all)
    assert whole["handover"]["serverSamples"] == frames_all.shape[0] * per_frame == whole["sampleCount"]
    assert "decoded by the server" in status_text(browser), status_text(browser)
    # cancelled while the server's audio plays: the utterance ends at its done, with the audio as far as it came
    stopped = speak(browser, *UTTERANCES[0], cancel_after_frames=6, load_handover_rtf=0)
    assert not stopped.get("error") and stopped["doneReason"] == "cancelled", stopped.get("error")
    assert stopped["handover"]["fromFrame"] == 0 and stopped["sampleCount"] <= stopped["frameCount"] * per_frame
    print(f"hand-over at frame {handover['fromFrame']} (page RTF {handover['rtf']:.2f}): page, seam, server vs full "
          f"decode {', '.join(f'{s:.1f}' for s in snrs)} dB; server part bit-exact")  # fmt: skip


def test_a_wrong_key_shows_an_error_then_the_page_works_again(browser, full_decode):
    assert call(browser, "await window.edgeTest.setApiKey(args[0]); return true;", "wrong-key", timeout=30) is True
    refused = speak(browser, "Hello.", "Ryan")
    assert refused.get("error"), f"a wrong API key gave no error: {refused}"
    deadline = time.monotonic() + 10
    while not (status_text(browser) or "").strip() and time.monotonic() < deadline:
        time.sleep(0.2)
    shown = status_text(browser) or ""
    assert "401" in shown or "key" in shown.lower(), f"#status does not say the key was refused: {shown!r}"
    assert call(browser, "await window.edgeTest.setApiKey(args[0]); return true;", KEY, timeout=30) is True
    assert_decodes_exactly(speak(browser, *UTTERANCES[1]), full_decode, "after the right key")


def test_the_api_answers_a_same_origin_page_without_extra_headers(browser, server):
    """COEP require-corp never blocks same-origin responses: the /v1 routes the page fetches need no CORP."""
    body = (
        "const r = await fetch('/v1/edge/plans/browser', {headers: {Authorization: 'Bearer ' + args[0]}});\n"
        "return {status: r.status, crossOriginIsolated: self.crossOriginIsolated, plan: (await r.json()).plan_id};"
    )
    answer = call(browser, body, KEY, timeout=30)
    with server.request("/v1/edge/plans/browser") as response:
        assert "cross-origin-resource-policy" not in {name.lower() for name in response.headers}
        plan_id = json.loads(response.read())["plan_id"]
    assert answer == {"status": 200, "crossOriginIsolated": True, "plan": plan_id}, answer


CLEAR_CACHE_STORAGE = (
    "for (const n of await caches.keys()) await caches.delete(n); return (await caches.keys()).length;"
)


def test_a_plan_with_a_bad_sha256_shows_an_error_then_loads_again(browser, server, full_decode):
    """The served artifact stops matching the plan's sha256 (the plan JSON is unchanged): a page without the
    verified copy in Cache Storage refuses it by name, keeps its decoder, and loads it once it is restored."""
    with server.request("/v1/edge/plans/browser") as response:
        plan = json.loads(response.read())
    name = next(iter(plan["artifacts"].values()))["file"]
    served = server.artifacts / "browser" / name  # read per request (FileResponse): a swap shows at once
    kept = served.with_name(name + ".kept")
    damaged = bytearray(served.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # same size: only the hash can tell
    os.replace(served, kept)
    try:
        served.write_bytes(damaged)
        assert call(browser, CLEAR_CACHE_STORAGE, timeout=30) == 0
        refused = call(browser, "return await window.edgeTest.reloadPlan();", timeout=PAGE_LOAD_S)
        shown = status_text(browser) or ""
    finally:
        os.replace(kept, served)
    assert refused["error"] and "sha256 mismatch" in refused["error"] and name in refused["error"], refused
    assert "sha256 mismatch" in shown and name in shown and "error" in status_class(browser), shown
    loaded = call(browser, "return await window.edgeTest.reloadPlan();", timeout=PAGE_LOAD_S)
    assert loaded["error"] is None and loaded["cached"] == [], loaded  # verified again: nothing damaged was cached
    assert status_text(browser) == "Ready."
    assert_decodes_exactly(speak(browser, *UTTERANCES[0]), full_decode, "after the plan was restored")


def status_class(driver) -> str:
    return driver.find_element("id", "status").get_attribute("class") or ""


def play_recording(driver, recording: bytes) -> dict:
    """``recording`` through the page's ``edgeTest.playRecording`` (the WebSocket's code path from the parser on)."""
    result = call(driver, "return await window.edgeTest.playRecording(args[0]);", list(recording), timeout=SPEAK_S)
    assert isinstance(result, dict) and "thrown" not in result, f"playRecording threw: {result}\n{console(driver)}"
    return result


def python_error(recording: bytes) -> str | None:
    """The error class Python's parser raises on ``recording`` (None: it parses)."""
    from vllm_omni.edge.stream import CodecStreamError, iter_events

    try:
        list(iter_events(io.BytesIO(recording)))
    except CodecStreamError as error:
        return type(error).__name__
    return None


def test_hostile_and_cut_off_streams_show_an_error_and_the_page_works_on(browser, server, full_decode):
    from vllm_omni.edge.stream import KIND_BINARY, KIND_JSON, RECORDING_MAGIC, CodecStreamEncoder, StreamStart, record

    with server.request("/v1/edge/plans/browser") as response:
        plan = json.loads(response.read())
    start = StreamStart(  # the plan's geometry, frame rate included (the page refuses a stream of another)
        num_quantizers=plan["num_quantizers"], codebook_size=plan["codebook_size"],
        frame_rate=plan["sample_rate"] / plan["samples_per_frame"], sample_rate=plan["sample_rate"],
        max_frames_per_message=4, hardware_class="browser", plan_id=plan["plan_id"],
    )  # fmt: skip
    frames = np.random.default_rng(29).integers(0, start.codebook_size, size=(13, start.num_quantizers))
    encoder = CodecStreamEncoder(start)
    head = RECORDING_MAGIC + record(KIND_JSON, encoder.start())
    messages = [
        record(KIND_BINARY, encoder.frames(frames[i : i + 4], end_of_stream=i + 4 >= len(frames)))
        for i in (0, 4, 8, 12)
    ]
    golden = head + b"".join(messages) + record(KIND_JSON, encoder.done())
    gap = head + messages[0] + b"".join(messages[2:])  # message 1 lost
    cut = golden[: len(head) + len(messages[0]) + len(messages[1]) + 9]  # 9 bytes into message 2's record
    assert python_error(golden) is None  # and Python's parser breaks where the page must:
    assert (python_error(gap), python_error(cut)) == ("SequenceGapError", "TruncatedStreamError")

    played = play_recording(browser, golden)
    assert played["frames"] == frames.tolist() and played["bytes"] == len(golden), played["bytes"]
    assert played["doneReason"] == "complete" and played["segmentEnds"] == [len(frames)], played["segmentEnds"]
    assert_decodes_exactly(played, full_decode, "the golden recording")
    assert status_text(browser).startswith("Done (complete): 13 frames")

    for label, recording, error, kept in (("gap", gap, "SequenceGapError", 4), ("cut", cut, "TruncatedStreamError", 8)):
        broken = play_recording(browser, recording)
        shown = status_text(browser) or ""
        assert broken["error"] and error in broken["error"], (label, broken["error"])
        assert error in shown and "broke the protocol" in shown and "error" in status_class(browser), (label, shown)
        assert broken["frames"] == frames[:kept].tolist(), label  # the messages before the break were decoded
        pcm, reference = np.asarray(broken["pcm"], dtype=np.float32), full_decode(frames[:kept])
        assert pcm.size == reference.size and snr_db(reference, pcm) >= MIN_SNR_DB, (label, pcm.size, reference.size)
        assert_decodes_exactly(speak(browser, *UTTERANCES[1]), full_decode, f"speak after the {label} recording")
        assert "error" not in status_class(browser), label

    # A stream of another frame rate is not this plan's (the Python client refuses it too): nothing is decoded.
    other_rate = CodecStreamEncoder(StreamStart(**{**start.__dict__, "frame_rate": start.frame_rate * 2}))
    other = RECORDING_MAGIC + record(KIND_JSON, other_rate.start()) + golden[len(head) :]
    refused = play_recording(browser, other)
    js = lambda rate: repr(rate).removesuffix(".0")  # noqa: E731 (a number as JavaScript writes it)
    assert f"frame_rate: stream {js(start.frame_rate * 2)}, plan {js(start.frame_rate)}" in refused["error"], refused
    assert refused["frames"] == [] and "error" in status_class(browser)


def test_stream_as_typed_is_one_segment_that_decodes_exactly(browser, full_decode):
    """The page's "Stream as typed" box: typing opens a ``"text_mode": "stream"`` session, the text goes out in
    pieces as it is typed (a typo fixed in the word being typed is never sent), Speak sends ``end``. Two sentences
    come back as one segment (sentence mode would make two), and the page's audio is the full decode of its frames."""
    from selenium.webdriver.common.keys import Keys

    field, box = browser.find_element("id", "text"), browser.find_element("id", "stream-typed")
    voice = browser.find_element("id", "voice").get_attribute("value")
    assert voice, "the page chose no voice of the checkpoint's (a CustomVoice checkpoint has no default speaker)"
    field.clear()  # the box is still off: clearing speaks nothing, and the utterance is what is typed next
    assert not box.is_selected()
    box.click()
    try:
        for key in [*"Hi there. How are yuo", *[Keys.BACKSPACE] * 2, *"ou?"]:
            field.send_keys(key)
            time.sleep(0.05)
        speak_button = browser.find_element("id", "speak")
        assert speak_button.is_enabled(), f"Speak is disabled while the text is typed: {status_text(browser)!r}"
        speak_button.click()  # `end`
        result = call(browser, "return await window.edgeTest.typedResult();", timeout=SPEAK_S)
    finally:
        box.click()  # off again for the tests after this one (an utterance still open would be ended)
    assert isinstance(result, dict) and "thrown" not in result, f"typedResult threw: {result}\n{console(browser)}"
    typed = "Hi there. How are you?"
    assert field.get_attribute("value") == typed
    assert "".join(result["textPieces"]) == typed and len(result["textPieces"]) >= 3, result["textPieces"]
    snr = assert_decodes_exactly(result, full_decode, "streamed as typed")
    frames = len(result["frames"])
    assert result["doneReason"] == "complete" and result["resets"] == [], (result["doneReason"], result["resets"])
    assert result["segmentEnds"] == [frames], f"not one segment: flushes at {result['segmentEnds']} of {frames}"
    assert status_text(browser).startswith(f"Done (complete): {frames} frames")
    print(f"streamed as typed: {result['textPieces']} -> {frames} frames, {result['framesAtEnd']} before end; "
          f"{snr:.1f} dB; first audio {result['firstAudioSeconds']:.3f} s")  # fmt: skip


# -- the API key travels in no URL; the page holds a bounded amount of audio --------------------------------


def network_events(driver) -> list[tuple[str, dict]]:
    """DevTools' Network events since the last call (``open_headless_chromium(network_log=True)``): (method, params)."""
    events = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method", "").startswith("Network."):
            events.append((message["method"], message.get("params", {})))
    return events


def lowered(headers: dict | None) -> dict[str, str]:
    return {str(name).lower(): str(value) for name, value in (headers or {}).items()}


def test_the_api_key_travels_in_no_url_referer_log_or_response(server, full_decode, tmp_path):
    """The page opened as ``/edge/browser#api_key=KEY`` (the redirect to ``/edge/browser/`` keeps the fragment in
    the browser) speaks with the key; the key (as written, URL-quoted or base64url as in the WebSocket's
    subprotocol) is in no line the server logged, no URL the page asked for, no Referer (there is none: the page's
    answers say ``Referrer-Policy: no-referrer``) and no response header; every answer of the page's routes
    carries that policy and the same-origin CSP; the key leaves the address bar. A key in the query is ignored and
    the page says so without it."""
    log_start = server.log.stat().st_size
    driver = open_headless_chromium(tmp_path / "profile", log_path=tmp_path / "chromedriver.log", console_log=True,
                                    network_log=True)  # fmt: skip
    try:
        driver.set_page_load_timeout(PAGE_LOAD_S)
        open_page(driver, f"{server.url}/edge/browser#api_key={urllib.parse.quote(KEY)}&{TEST_HOOK}")
        assert driver.execute_script("return location.href;") == f"{server.url}/edge/browser/#{TEST_HOOK}"
        assert driver.find_element("id", "api-key").get_attribute("value") == KEY  # the field holds it
        assert_decodes_exactly(speak(driver, *UTTERANCES[0]), full_decode, "a page keyed by its fragment")
        events = network_events(driver)
        refused = [line for line in console(driver).splitlines() if "Content Security Policy" in line]
        assert not refused, f"the page broke its own CSP: {refused}"

        # A key in the query: the server has it (the request carried it), the page does not use it, says so, and
        # drops it from the address; without #edge_test=1 the page has no test hook.
        query_key = "query-key-456"
        driver.get(f"{server.url}/edge/browser/?api_key={query_key}&threads=1")
        deadline = time.monotonic() + PAGE_LOAD_S
        while "ignored" not in (shown := status_text(driver) or "") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "?api_key=" in shown and "ignored" in shown and query_key not in shown, shown
        assert "401" in shown and "error" in status_class(driver), shown  # no key was used
        assert driver.find_element("id", "api-key").get_attribute("value") == ""
        assert driver.execute_script("return [location.href, window.edgeTest === undefined];") == [
            f"{server.url}/edge/browser/?threads=1", True]  # fmt: skip
    finally:
        driver.quit()

    forms = {KEY, urllib.parse.quote(KEY, safe=""), bearer(KEY).removeprefix("bearer.")}
    urls, referers, page_responses = [], [], []
    answers: list[tuple[str, dict]] = []  # (url, response headers)
    for method, params in events:
        request = params.get("request") or {}
        response = params.get("response") or params.get("redirectResponse") or {}
        named = (request.get("url"), response.get("url"), params.get("documentURL"), params.get("url"))
        urls += [u for u in named if u]
        sent = lowered(request.get("headers"))
        if method == "Network.requestWillBeSentExtraInfo":  # the headers as sent
            sent |= lowered(params.get("headers"))
        if sent.get("referer"):  # DevTools lists an empty one where none is sent
            referers.append((request.get("url"), sent["referer"]))
        if response:
            answers.append((response.get("url", ""), lowered(response.get("headers"))))
        if method == "Network.responseReceivedExtraInfo":
            answers.append(("(raw)", lowered(params.get("headers"))))
    for url, headers in answers:
        if urllib.parse.urlsplit(url).path.startswith("/edge/browser"):
            page_responses.append(url)
            assert_page_headers(url, headers)
    paths = {urllib.parse.urlsplit(u).path for u in urls}
    assert {"/edge/browser", "/edge/browser/", "/edge/browser/app.mjs", "/v1/audio/voices"} <= paths, sorted(paths)
    assert "/v1/audio/speech/stream" in paths and any(u.startswith("ws://") for u in urls), sorted(paths)
    assert len(page_responses) >= 4 and any(u.endswith("/edge/browser") for u in page_responses), page_responses
    assert not referers, f"requests sent a Referer: {referers}"
    for form in forms:
        assert not [u for u in urls if form in u], f"the key ({form}) is in a URL the page asked for"
        assert not [h for _, h in answers if form in json.dumps(h)], f"the key ({form}) is in a response header"
    logged = server.log.read_bytes()[log_start:].decode(errors="replace")
    # The access log has every request, the decoder worker's too (DevTools' log here has the page's only).
    for request in ("GET /edge/browser HTTP", "GET /edge/browser/decoder_worker.mjs", "GET /edge/browser/ort/ort-"):
        assert request in logged, f"the server log has no {request!r}: no access log to check?"
    for form in forms:
        assert form not in logged, f"the server logged the key ({form})"
    print(f"key check: {len(events)} network events, {len(set(urls))} URLs, {len(page_responses)} page answers, "
          f"{len(logged.splitlines())} server log lines, no key anywhere")  # fmt: skip


# Sentence mode: each sentence its own request (and segment), each bounded by the model length.
OPENINGS = ("This", "Then a", "Another", "Yet another", "One more", "Still a", "And a", "Last comes a")
LONG_TEXT = " ".join(f"{opening} sentence number {n} goes on for a while." for n, opening in enumerate(OPENINGS, 1))

WATCH_MEMORY = """
const samples = [];
let done = false;
const spoken = window.edgeTest.speak(args[0], {voice: args[1]}).finally(() => { done = true; });
while (!done) {
  samples.push(window.edgeTest.memory());
  await new Promise((r) => setTimeout(r, 100));
}
const r = await spoken;
samples.push(window.edgeTest.memory());
return {samples, result: {frameCount: r.frameCount, sampleCount: r.sampleCount, frames: r.frames.length,
  pcm: r.pcm.length, captureComplete: r.captureComplete, error: r.error, doneReason: r.doneReason}};
"""


def test_a_long_stream_holds_a_bounded_amount_of_audio(browser):
    """One utterance of many sentences, longer than the page keeps for a test: while its frames arrive, the frames
    and samples the page holds (``edgeTest.memory()``) stay under a fixed bound (the first CAPTURE_FRAMES frames
    of the utterance and their PCM, plus the last typed result), however many it received."""
    before = call(browser, "return window.edgeTest.memory();", timeout=30)
    assert isinstance(before, dict) and "thrown" not in before, before
    assert before["captureFrames"] == PAGE_CAPTURE_FRAMES and before["samplesPerFrame"] > 0, before
    cap_frames, per_frame = PAGE_CAPTURE_FRAMES, before["samplesPerFrame"]
    assert before["frames"] <= cap_frames and before["samples"] <= cap_frames * per_frame, before  # held from before
    watched = call(browser, WATCH_MEMORY, LONG_TEXT, "Ryan", timeout=SPEAK_S * 3)
    assert isinstance(watched, dict) and "thrown" not in watched, f"{watched}\n{console(browser)}"
    result, samples = watched["result"], watched["samples"]
    assert not result["error"] and result["doneReason"] == "complete", result
    assert result["frameCount"] > cap_frames, f"the stream was too short to show the bound: {result}"
    assert (result["frames"], result["captureComplete"]) == (cap_frames, False), result
    assert result["pcm"] <= cap_frames * per_frame and result["sampleCount"] > result["pcm"], result
    received = [s["framesReceived"] - before["framesReceived"] for s in samples]
    assert received[-1] == result["frameCount"] and received == sorted(received), received
    bound_frames, bound_samples = before["frames"] + cap_frames, before["samples"] + cap_frames * per_frame
    for sample in samples:
        assert sample["frames"] <= bound_frames and sample["samples"] <= bound_samples, (sample, bound_frames)
    growing = [s for s in samples if s["framesReceived"] - before["framesReceived"] > cap_frames]
    assert growing, "no sample was taken after the bound was passed"
    print(f"long stream: {result['frameCount']} frames, {result['sampleCount']} samples received and decoded; "
          f"held at most {max(s['frames'] for s in samples)} frames, {max(s['samples'] for s in samples)} samples "
          f"(bound {bound_frames}, {bound_samples}) over {len(samples)} readings")  # fmt: skip
