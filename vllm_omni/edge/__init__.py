"""Edge decoding of Qwen3-TTS codec frames: export, verify, describe and run Code2Wav on devices.

One folder per layer, imports pointing down only (enforced by import-linter, see pyproject.toml
and docs/architecture.md): ``cli`` > ``client`` > ``builders`` > ``runtime`` > ``backends`` >
``plan`` | ``hardware`` | ``stream`` > ``graphs`` | ``checkpoint`` > ``audio`` | ``integrity`` >
``files`` | ``geometry`` > ``errors`` | ``progress``. ``testing`` (random-weight checkpoints, the
demo) sits beside them and no library module imports it.
"""
