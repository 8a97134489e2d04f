"""Edge decoding of Qwen3-TTS codec frames: export, verify, describe and run Code2Wav on devices.

One folder per layer, imports pointing down only (enforced by import-linter, see pyproject.toml
and docs/architecture.md): ``cli`` > ``client`` > ``stream`` > ``build`` > ``runtime`` >
``backends`` > ``plan`` | ``hardware`` > ``graphs`` > ``checkpoint`` > ``geometry`` / ``files`` /
``audio`` / ``errors``. ``testing`` (random-weight checkpoints, the demo) sits beside them and no
library module imports it.
"""
