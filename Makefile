# Entry points for a fresh machine. Every target sets up what it needs, incrementally.
PY := .venv/bin/python

.PHONY: setup setup-oracle setup-rknn demo test lint bench bench-rknn clean

setup:
	@tools/setup_venv.sh .venv requirements/dev.txt --editable

setup-oracle:
	@tools/setup_venv.sh .venv-oracle tools/oracle/requirements.txt --no-deps tools/oracle/requirements-nodeps.txt

# The RKNN converter venv: rknn-toolkit2 2.5.0 (--no-deps) beside torch 2.13.0 and the toolkit's own pins.
setup-rknn:
	@tools/setup_venv.sh .venv-rknn tools/rknn/requirements.txt --no-deps tools/rknn/requirements-nodeps.txt --editable

# Main job on the embedded default: a random-weight checkpoint in the released layout -> the plan of
# every hardware class (rockchip_npu compiles in the converter venv), each decoding a stream.
demo: setup setup-rknn
	$(PY) -m vllm_omni.edge.testing.demo --out out/demo

test: setup setup-oracle setup-rknn
	$(PY) -m ruff check .
	.venv/bin/lint-imports
	$(PY) -m pytest -q

# ruff, then the layer contracts of pyproject.toml [tool.importlinter] (docs/architecture.md).
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	.venv/bin/lint-imports

bench: setup
	$(PY) benchmarks/bench_full_decode.py --out out/bench
	$(PY) benchmarks/bench_stateful.py --out out/bench
	$(PY) benchmarks/bench_windowed.py --out out/bench
	$(PY) benchmarks/bench_codec_stream.py --out out/bench
	$(PY) benchmarks/bench_client.py --out out/bench

# Released-geometry RKNN compile + simulator check (about 5 GB of RAM and minutes per step size).
bench-rknn: setup setup-rknn
	.venv-rknn/bin/python benchmarks/bench_rknn.py --out out/bench

clean:
	rm -rf out .pytest_cache
