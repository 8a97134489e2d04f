"""Edge decoding of Qwen3-TTS codec frames: export, verify, describe and run Code2Wav on devices.

One folder per layer, imports pointing down only (enforced by import-linter, see pyproject.toml
and docs/architecture.md): ``cli`` > ``client`` > ``builders`` > ``runtime`` > ``backends`` >
``plan`` | ``hardware`` | ``stream`` > ``graphs`` | ``checkpoint`` > ``audio`` | ``integrity`` >
``files`` | ``geometry`` | ``entry_points`` > ``errors`` | ``progress``. The test kit (:mod:`vllm_omni.testing`:
random-weight checkpoints, the demo) sits beside the layers and no library module imports it.
"""
