"""``vllm serve ... --omni``: vLLM's CLI hands the command line to :func:`main.main`."""
