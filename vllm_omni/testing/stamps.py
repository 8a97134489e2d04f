"""What a random-weight checkpoint records about how it was written, and whether one on disk is the one asked for.

The one rule for keeping a checkpoint, read by the test kit's writers (:func:`.make_checkpoint.ensure_checkpoint`)
and the benchmarks' (``benchmarks.harness.ensure_checkpoint``). Torch-free: the stamps are plain JSON in the
configs, at the paths of the released layout (``vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.files``
names them, but importing that package imports torch).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SPEECH_TOKENIZER_CONFIG = Path("speech_tokenizer") / "config.json"
SPEECH_TOKENIZER_WEIGHTS = Path("speech_tokenizer") / "model.safetensors"
TALKER_CONFIG = Path("config.json")
TALKER_WEIGHTS = Path("model.safetensors")
STAMP_KEY = "random_weights"


def random_weights_stamp(geometry: str, seed: int, drive: str | None = None) -> dict:
    """The decoder's stamp: geometry, seed, a real encoder half, and the fp16-study ``drive`` unless it is the
    plain weights (``None`` or ``hot``: :mod:`.drive`)."""
    stamp = {"geometry": geometry, "seed": seed, "encoder": True}
    if drive not in (None, "hot"):
        stamp["drive"] = drive
    return stamp


def read_stamp(config: Path) -> dict | None:
    """The stamp a config holds, or None (no file, not JSON, no stamp)."""
    try:
        stamp = json.loads(config.read_text()).get(STAMP_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    return stamp if isinstance(stamp, dict) else None


def is_current(
    out: str | os.PathLike[str], geometry: str, seed: int, *, talker: str | None = None, drive: str | None = None
) -> bool:
    """Whether ``out`` holds a complete checkpoint written with these arguments (a talker too when ``talker``)."""
    out = Path(out)
    if not (out / SPEECH_TOKENIZER_WEIGHTS).is_file():
        return False
    if read_stamp(out / SPEECH_TOKENIZER_CONFIG) != random_weights_stamp(geometry, seed, drive):
        return False
    if talker is None:
        return True
    stamp = read_stamp(out / TALKER_CONFIG)
    return bool(stamp and stamp.get("talker_geometry") == talker and (out / TALKER_WEIGHTS).is_file())
