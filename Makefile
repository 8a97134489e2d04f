# Entry points for a fresh machine. Every target sets up what it needs, incrementally.
PY := .venv/bin/python

.PHONY: setup setup-oracle demo test lint bench clean

setup:
	@tools/setup_venv.sh .venv requirements/dev.txt --editable

setup-oracle:
	@tools/setup_venv.sh .venv-oracle tools/oracle/requirements.txt --no-deps tools/oracle/requirements-nodeps.txt

# Main job on the embedded default: a random-weight checkpoint in the released layout -> WAV.
demo: setup
	$(PY) -m vllm_omni.edge.demo --out out/demo

test: setup setup-oracle
	$(PY) -m ruff check .
	$(PY) -m pytest -q

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: setup
	$(PY) benchmarks/bench_full_decode.py --out out/bench
	$(PY) benchmarks/bench_stateful.py --out out/bench

clean:
	rm -rf out .pytest_cache
