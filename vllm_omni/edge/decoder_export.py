"""``python -m vllm_omni.edge.decoder_export``: the windowed export's command line (:mod:`.cli.export`)."""

from .cli.export import main

if __name__ == "__main__":
    raise SystemExit(main())
