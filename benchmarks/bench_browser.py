"""The browser class in headless Chromium: plan load, first audio, decode RTF, plan load time and peak memory per
decoder setting (WASM at 1/2/4 threads, WASM without the CPU arena or prepacking, WebGPU on SwiftShader), and the
native onnxruntime step of the same plan (and of the CPU classes' plan: the layouts' cost) over the same frames.

    .venv-vllm/bin/python -m benchmarks.bench_browser --geometry small|released [--out out/bench_browser]
        [--threads 1 2 4] [--native-threads 1 2] [--max-model-len 160] [--webgpu | --no-webgpu]

RANDOM WEIGHTS: a checkpoint written by ``make_checkpoint --talker tiny`` (reused across runs) behind a loopback
``vllm serve CKPT --omni --edge-hardware browser,cpu_x86_64`` (its plans built at the first start, kept under
``--out``); Debian's chromium and chromedriver (``make setup-browser``), Selenium from the serving venv.

Measured, in order, on one page (``/edge/browser/#api_key=KEY&edge_test=1``, its ``window.edgeTest`` hook):

- plan load (fetch, sha256 in WebCrypto, a worker and its onnxruntime-web session): cold, the page's first
  load in a fresh browser profile; cached, ``reloadPlan()`` with the verified files in Cache Storage;
- one utterance over the WebSocket (the tiny talker generating on this host's CPUs): first audio (from the
  call to the first decoded PCM), bytes, frames; the model length bounds it (the random talker rarely stops);
- the frames that utterance brought, replayed as a recording (``edgeTest.playRecording``, 4 frames a message)
  after ``reloadPlan`` with each decoder setting: the worker's decode seconds / audio seconds (RTF), first audio,
  the plan load (files from Cache Storage, session, both steps warmed), the browser's peak memory from the reload
  to the end of the replay, and the SNR of the page's PCM against the native decode; the server idles meanwhile,
  so the decode has the CPUs. The WebGPU row runs on SwiftShader (Chromium's software Vulkan: no GPU here): it
  checks the path and its memory, and its speed says nothing about a real GPU (default: small geometry only,
  where a replay takes minutes; at the released geometry SwiftShader would take hours);
- the browser's memory: the RSS of chromedriver's descendants (the browser, renderer, GPU and utility
  processes; shared pages count once per process, so the sum is an upper bound) and their PSS (each page
  counted once), sampled every 0.25 s: on ``about:blank``, the peak of the page's cold load and first
  utterance, after it, and the peak of the whole run (a terminated worker's memory is freed lazily);
- the native step: ``open_decoder(plan, threads=N)`` in this process over the same frames, 4 at a time.

Writes ``browser_{geometry}.json`` under ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.harness import BenchmarkError, ensure_checkpoint, number, run_cli, table, vllm_server, write_json
from vllm_omni.testing.browser import open_headless_chromium, run_in_page

KEY = "bench-key"
# Decoder settings beside the WASM thread counts: (name, reloadPlan options); threads None: the page's default.
MEMORY_SETTINGS = (
    ("WASM, no CPU arena", {"sessionOptions": {"enableCpuMemArena": False}}),
    ("WASM, no prepacking", {"sessionOptions": {"extra": {"session": {"disable_prepacking": "1"}}}}),
    (
        "WASM, neither",
        {"sessionOptions": {"enableCpuMemArena": False, "extra": {"session": {"disable_prepacking": "1"}}}},
    ),
    # the CPU classes' graph (time_on_width: sin/cos ops, int64 codes, weights inside): what the webgpu layout costs
    ("WASM, the CPU classes' graph", {"hardwareClass": "cpu_x86_64"}),
)
WEBGPU_SETTING = ("WebGPU (SwiftShader)", {"provider": "webgpu", "softwareAdapter": True})
FRAMES_PER_MESSAGE = 4
TEXT, VOICE = "Hello there, this is a benchmark of the page that decodes speech in the browser.", "Ryan"


@contextlib.contextmanager
def serving(checkpoint: Path, artifacts: Path, log: Path, max_model_len: int, start_timeout: float):
    """``vllm serve`` on a free loopback port behind :data:`KEY`, once ``/health`` answers: its URL."""
    started = time.monotonic()
    server = vllm_server(
        checkpoint,
        artifacts,
        log,
        ("--api-key", KEY),
        hardware="browser,cpu_x86_64",
        max_model_len=max_model_len,
        kv_cache=str(64 << 20),
        start_timeout=start_timeout,
        stop_timeout=60,
    )
    with server as running:
        print(f"[bench] server up in {time.monotonic() - started:.0f} s (plans built or reused)", flush=True)
        yield running.url


class TreeMemory:
    """The summed RSS and PSS (MiB) of a process's descendants, sampled in a thread; peaks since the last reset.
    PSS divides each shared page among the processes mapping it, so its sum counts each page once."""

    def __init__(self, root_pid: int, every_s: float = 0.25) -> None:
        import psutil

        self._root, self._every = psutil.Process(root_pid), every_s
        self.peak = self.now = self.peak_pss = self.now_pss = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> tuple[float, float]:
        """(RSS, PSS) summed over the descendants now, MiB."""
        import psutil

        rss = pss = 0
        for process in self._root.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # a process that ended between the listing and the read
                info = process.memory_full_info()
                rss, pss = rss + info.rss, pss + info.pss
        return rss / 2**20, pss / 2**20

    def _run(self) -> None:
        while not self._stop.is_set():
            self.now, self.now_pss = self.sample()
            self.peak, self.peak_pss = max(self.peak, self.now), max(self.peak_pss, self.now_pss)
            self._stop.wait(self._every)

    def reset(self) -> None:
        self.peak, self.peak_pss = self.now, self.now_pss

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def page_call(driver, body: str, *args, timeout: float = 600):
    """``body`` (an async function's body, ``args`` as ``args``) in the page; a rejection raises."""
    result = run_in_page(driver, body, *args, timeout=timeout, wait_for_hook=True)
    if isinstance(result, dict) and ("thrown" in result or result.get("error")):
        raise BenchmarkError(f"the page failed: {result.get('thrown') or result.get('error')}")
    return result


def as_recording(frames: np.ndarray, plan: dict) -> bytes:
    from vllm_omni.edge.stream import StreamStart, encode_recording

    start = StreamStart(
        num_quantizers=plan["num_quantizers"], codebook_size=plan["codebook_size"], frame_rate=12.5,
        sample_rate=plan["sample_rate"], max_frames_per_message=FRAMES_PER_MESSAGE,
        hardware_class=plan["hardware_class"],
        plan_id=plan["plan_id"],
    )  # fmt: skip
    last = len(frames) - FRAMES_PER_MESSAGE
    batches = [
        (frames[i : i + FRAMES_PER_MESSAGE], {"end_of_stream": i >= last})
        for i in range(0, len(frames), FRAMES_PER_MESSAGE)
    ]
    return encode_recording(start, batches)


def native_decode(plan_dir: Path, frames: np.ndarray, threads: int) -> tuple[dict, np.ndarray]:
    """The onnxruntime step of ``plan_dir`` over ``frames`` (4 a feed, as the page's messages): RTF, first audio."""
    from vllm_omni.edge.plan import ExecPlan
    from vllm_omni.edge.runtime.open import open_decoder

    plan = ExecPlan.load(plan_dir)
    started = time.perf_counter()
    decoder = open_decoder(plan, threads=threads)
    open_seconds = time.perf_counter() - started
    pieces, seconds, first_audio = [], 0.0, None
    for index in range(0, len(frames), FRAMES_PER_MESSAGE):
        started = time.perf_counter()
        pcm = decoder.feed(frames[index : index + FRAMES_PER_MESSAGE])
        seconds += time.perf_counter() - started
        if pcm.size and first_audio is None:
            first_audio = seconds
        pieces.append(pcm)
    started = time.perf_counter()
    pieces.append(decoder.flush())
    seconds += time.perf_counter() - started
    audio = np.concatenate(pieces).astype(np.float32)
    audio_seconds = audio.size / plan.codec.sample_rate
    row = {"threads": threads, "open_seconds": open_seconds, "seconds": seconds, "rtf": seconds / audio_seconds}
    return {**row, "first_audio_seconds": first_audio}, audio


def run(args: argparse.Namespace) -> dict:
    from vllm_omni.edge.audio import snr_db
    from vllm_omni.edge.backends.onnx.graph import graph_layout
    from vllm_omni.edge.plan import ExecPlan

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = ensure_checkpoint(out / f"checkpoint-{args.geometry}", args.geometry, talker="tiny")
    artifacts = out / f"artifacts-{args.geometry}"
    profile = out / f"chromium-profile-{args.geometry}"
    shutil.rmtree(profile, ignore_errors=True)  # a fresh browser: nothing cached from a last run
    result: dict = {"geometry": args.geometry, "weights": "random", "host_cpus": os.cpu_count()}
    log = out / f"server-{args.geometry}.log"
    with serving(checkpoint, artifacts, log, args.max_model_len, args.start_timeout) as url:
        plans = {}
        for name in ("browser", "cpu_x86_64"):
            request = urllib.request.Request(f"{url}/v1/edge/plans/{name}", headers={"Authorization": f"Bearer {KEY}"})
            with urllib.request.urlopen(request, timeout=60) as response:
                plans[name] = json.loads(response.read())
        plan = plans["browser"]
        records = [r for a in plan["artifacts"].values() for r in (a, a.get("external_data")) if r is not None]
        files = {r["file"]: r["size_bytes"] for r in records}  # the graph and its external data
        result["plan"] = {"plan_id": plan["plan_id"], "bytes": sum(files.values()), "files": sorted(files)}
        driver = open_headless_chromium(profile, software_webgpu=True)
        memory = TreeMemory(driver.service.process.pid)
        try:
            time.sleep(1)
            blank = memory.sample()
            memory.reset()
            driver.set_page_load_timeout(120)
            # a fresh profile: a cold load; the key in the fragment (no request carries it), the test hook asked for
            driver.get(f"{url}/edge/browser/#api_key={urllib.parse.quote(KEY)}&edge_test=1")
            page_call(driver, "await window.edgeTest.ready; return true;")
            result["browser"] = page_call(
                driver,
                "return {userAgent: navigator.userAgent, hardwareConcurrency: navigator.hardwareConcurrency, "
                "crossOriginIsolated: self.crossOriginIsolated};",
            )
            # the page decodes the whole utterance (no hand-over to the server's audio): its own speed is measured
            spoken = page_call(
                driver,
                "return await window.edgeTest.speak(args[0], {voice: args[1], handoverRtf: 1e9, "
                "loadHandoverRtf: 1e9});",
                TEXT,
                VOICE,
            )
            page_peak = (memory.peak, memory.peak_pss)
            if args.screenshot:  # the page after its first utterance: status line and numbers
                driver.save_screenshot(str(args.screenshot))
            time.sleep(2)
            after_utterance = memory.sample()
            cached = page_call(driver, "return await window.edgeTest.reloadPlan();")
            assert sorted(cached["cached"]) == sorted(files), cached
            result["plan_load_seconds"] = {"cold": spoken["planSeconds"], "cached": cached["planSeconds"]}
            print(f"[bench] plan load: cold {spoken['planSeconds']:.2f} s, cached {cached['planSeconds']:.2f} s")
            # the page keeps an utterance's first 512 frames (and their PCM) for its test hook, no more
            assert spoken["captureComplete"], f"{spoken['frameCount']} frames: lower --max-model-len"
            frames = np.asarray(spoken["frames"], dtype=np.int64)
            audio_seconds = len(spoken["pcm"]) / plan["sample_rate"]
            result["speak"] = {
                "frames": len(frames),
                "audio_seconds": audio_seconds,
                "bytes": spoken["bytes"],
                "first_audio_seconds": spoken["firstAudioSeconds"],
                "rtf_while_generating": spoken["rtf"],
                "threads": cached["threads"],
            }
            print(f"[bench] speak: {len(frames)} frames, {audio_seconds:.2f} s, first audio "
                  f"{spoken['firstAudioSeconds']:.3f} s, RTF {spoken['rtf']:.3f}", flush=True)  # fmt: skip
            recordings = {name: as_recording(frames, plans[name]) for name in plans}
            plan_dir = artifacts / "browser"
            _, reference = native_decode(plan_dir, frames, 1)
            settings = [(f"WASM, {t} thread(s)", {"threads": t}) for t in args.threads] + list(MEMORY_SETTINGS)
            if args.webgpu if args.webgpu is not None else args.geometry == "small":
                settings.append(WEBGPU_SETTING)
            rows = []
            for name, options in settings:
                # each setting on a fresh page after an empty one: the last one's workers are gone (their memory
                # freed, not just marked), and its peak counts from what the browser holds on about:blank
                driver.get("about:blank")
                time.sleep(2)
                baseline = memory.sample()
                memory.reset()
                driver.get(f"{url}/edge/browser/#api_key={urllib.parse.quote(KEY)}&edge_test=1&load_plan=0")
                page_call(driver, "await window.edgeTest.ready; return true;")
                options = {"provider": "wasm", "threads": None, "softwareAdapter": False, **options}
                loaded = page_call(driver, "return await window.edgeTest.reloadPlan(args[0]);", options)
                if loaded.get("error"):
                    print(f"[bench] {name}: {loaded['error']}", flush=True)
                    continue
                recording = recordings[options.get("hardwareClass", "browser")]
                played = page_call(driver, "return await window.edgeTest.playRecording(args[0]);", list(recording))
                pcm = np.asarray(played["pcm"], dtype=np.float32)
                row = {
                    "setting": name,
                    "provider": loaded["provider"],
                    "threads": loaded["threads"],
                    "rtf": played["rtf"],
                    "first_audio_seconds": played["firstAudioSeconds"],
                    "plan_load_seconds": loaded["planSeconds"],
                    "warm_seconds": loaded["warmSeconds"],
                    "peak_mb": {"rss": memory.peak, "pss": memory.peak_pss},
                    "blank_mb": {"rss": baseline[0], "pss": baseline[1]},
                    "snr_db_vs_native": round(snr_db(reference, pcm), 1) if pcm.size == reference.size else None,
                }
                rows.append(row)
                print(f"[bench] {name}: RTF {row['rtf']:.3f}, first audio {row['first_audio_seconds']:.3f} s, "
                      f"plan load {row['plan_load_seconds']:.2f} s, peak PSS {memory.peak_pss:.0f} MiB")  # fmt: skip
            result["settings"] = rows
            result["browser_memory_mb"] = {
                name: dict(zip(("rss", "pss"), values, strict=True))
                for name, values in (
                    ("blank", blank),
                    ("page_peak", page_peak),
                    ("after_utterance", after_utterance),
                    ("whole_run_peak", (memory.peak, memory.peak_pss)),
                )
            }
        finally:
            memory.close()
            driver.quit()
    result["native"] = []
    # the browser's graph (webgpu layout) and the CPU classes' (time_on_width) on the same kernels: what the
    # browser's polynomial sines and stacked lookup cost where a sin or cos op is cheap
    for plan_name in ("browser", "cpu_x86_64"):
        layout = graph_layout(ExecPlan.load(artifacts / plan_name, check_sha256=False).path("main"))
        for threads in args.native_threads:
            row, audio = native_decode(artifacts / plan_name, frames, threads)
            row["layout"] = layout
            row["snr_db_vs_native_1"] = round(snr_db(reference, audio), 1)
            result["native"].append(row)
            print(f"[bench] native onnxruntime, {layout} graph, {threads} thread(s): RTF {row['rtf']:.3f}", flush=True)
    return result


def report_table(result: dict) -> str:
    speak, load, memory = result["speak"], result["plan_load_seconds"], result["browser_memory_mb"]
    mib = {name: f"{row['rss']:.0f} / {row['pss']:.0f}" for name, row in memory.items()}
    lines = [
        f"browser class, {result['geometry']} geometry, RANDOM WEIGHTS; headless Chromium "
        f"({result['browser']['hardwareConcurrency']} logical CPUs, cross-origin isolated: "
        f"{result['browser']['crossOriginIsolated']}); plan {result['plan']['bytes'] / 2**20:.1f} MiB",
        f"plan load: cold {load['cold']:.2f} s, cached {load['cached']:.2f} s; one utterance over the WebSocket: "
        f"{speak['frames']} frames ({speak['audio_seconds']:.2f} s of audio), {speak['bytes']:,} B, first audio "
        f"{speak['first_audio_seconds']:.3f} s, RTF {speak['rtf_while_generating']:.3f} "
        f"({speak['threads']} threads, the talker generating on the same CPUs)",
        f"browser memory, RSS / PSS MiB summed over its processes: about:blank {mib['blank']}; peak of the page's "
        f"cold load and first utterance {mib['page_peak']}; after it {mib['after_utterance']}; peak of the whole "
        f"run ({2 + len(result['settings'])} plan loads) {mib['whole_run_peak']}",
        f"plan weights {result['plan']['bytes'] / 2**20:.0f} MiB; peak: the browser's summed PSS from a fresh page's "
        "plan load to the replay's end; x plan: that peak less about:blank's just before, over the plan's bytes",
        "",
    ]
    plan_mib = result["plan"]["bytes"] / 2**20
    rows = []
    for row in result["settings"]:
        peak, blank = row["peak_mb"]["pss"], row["blank_mb"]["pss"]
        rows.append(
            (
                f"onnxruntime-web {row['setting']}", row["threads"] or None, number(row["rtf"], 3),
                number(row["first_audio_seconds"], 3), number(row["plan_load_seconds"]),
                f"{peak:.0f} ({(peak - blank) / plan_mib:.1f}x)", row["snr_db_vs_native"],
            )
        )  # fmt: skip
    for row in result["native"]:
        rows.append(
            (
                f"onnxruntime native (Python), {row['layout']} graph", row["threads"], number(row["rtf"], 3),
                number(row["first_audio_seconds"], 3), None, None, row["snr_db_vs_native_1"],
            )
        )  # fmt: skip
    headers = ("decoder (same frames)", "threads", "RTF", "first audio s", "plan load s", "peak PSS MiB (x plan)")
    lines.append(table((*headers, "SNR dB vs native"), rows))
    if any(row["provider"] == "webgpu" for row in result["settings"]):
        lines.append("WebGPU ran on SwiftShader (software Vulkan on the CPUs): its RTF says nothing about a real GPU.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench_browser"))
    parser.add_argument("--geometry", choices=("released", "small"), default="small")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4], help="WASM threads in the page")
    parser.add_argument("--native-threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-model-len", type=int, default=160, help="bounds the utterance (prompt + frames)")
    parser.add_argument("--start-timeout", type=float, default=1800, help="seconds for the server (plan builds)")
    parser.add_argument("--screenshot", type=Path, help="save the page after its first utterance (PNG)")
    parser.add_argument(
        "--webgpu",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the WebGPU (SwiftShader) row; default: at the small geometry only",
    )
    args = parser.parse_args(argv)
    result = run(args)
    path = write_json(args.out / f"browser_{args.geometry}.json", result)
    print(report_table(result))
    print(f"[bench] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
