"""The stateful step's contract and flat-cache layout, as data (no torch, no onnx: runtimes import this).

A step graph decodes ``step_frames`` (B) new frames from continuous state::

    audio_codes  int64[1, Q, B]        the new frames, codebook-major (int32 where codes_dtype says so)
    freqs_in     float32[B, D/2]       RoPE angles pos * inv_freq, reduced mod 2*pi on the host
    cache_valid  float32[1]            real KV slots: min(position, kv_slots)
    cache_in     float32[N]            the flat cache
 -> audio_values float32[B * samples_per_frame]
    cache_out    float32[N]

``N`` (``cache_numel``) does not depend on B, so steps of different sizes share one cache. The
layout lists every region of the cache in data-flow order; a runtime builds the zero cache from
it, never from hard-coded numbers.

A graph is static (it takes exactly ``step_frames``) or, when ``max_step_frames`` is set, dynamic:
it takes any B in ``1 .. max_step_frames``, so one graph (one copy of the weights) serves a
plan's first and main steps. A dynamic graph's own metadata says ``step_frames = max_step_frames``;
a plan's role says the B it runs (:meth:`StepContract.for_frames`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import EdgeError
from ..geometry import CodecGeometry

# The contract's fields and bounds are data, read by this module and by the browser's reader
# (web/edge/stateful_decoder.mjs) alike: one JSON Schema beside the plan's. It is a file of the plan
# layer's folder read by path (the plan layer imports this module, never the reverse).
STEP_SCHEMA_PATH = Path(__file__).parents[1] / "plan" / "schemas" / "step_contract.schema.json"
STEP_SCHEMA: dict[str, Any] = json.loads(STEP_SCHEMA_PATH.read_text())
_FIELDS = STEP_SCHEMA["properties"]
STEP_SCHEMA_VERSION: int = _FIELDS["schema_version"]["const"]
# Bounds a contract read from a file must keep (checked before a runtime allocates from them): far above
# the released step (B 16, N 1,303,424 floats, head_dim 64, 71 KV slots), far below exhausting memory.
# (minimum, maximum) of each integer field, in the schema's order (the order both readers check them in).
COUNT_BOUNDS: dict[str, tuple[int, int]] = {
    key: (rule["minimum"], rule["maximum"]) for key, rule in _FIELDS.items() if rule.get("type") == "integer"
}
LIMITS = {key: high for key, (_low, high) in COUNT_BOUNDS.items()}
MAX_LAYOUT_ENTRIES: int = _FIELDS["cache_layout"]["maxItems"]
_SHAPE = _FIELDS["cache_layout"]["items"]["prefixItems"][3]
MAX_LAYOUT_RANK: int = _SHAPE["maxItems"]
MAX_LAYOUT_DIM: int = _SHAPE["items"]["maximum"]
INPUT_NAMES: tuple[str, ...] = tuple(_FIELDS["input_names"]["const"])
OUTPUT_NAMES: tuple[str, ...] = tuple(_FIELDS["output_names"]["const"])
CODES_DTYPES: tuple[str, ...] = tuple(_FIELDS["codes_dtype"]["enum"])  # the first is the default


class StepContractError(EdgeError):
    """A step graph's metadata is missing, from another schema, or inconsistent."""


@dataclass(frozen=True)
class CacheEntry:
    """One region of the flat cache: ``cache[offset : offset + numel]`` viewed as ``shape``."""

    name: str
    offset: int
    numel: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CacheLayout:
    entries: tuple[CacheEntry, ...]

    @classmethod
    def from_shapes(cls, shapes: list[tuple[str, tuple[int, ...]]]) -> CacheLayout:
        entries, offset = [], 0
        for name, shape in shapes:
            numel = math.prod(shape)
            entries.append(CacheEntry(name, offset, numel, tuple(shape)))
            offset += numel
        return cls(tuple(entries))

    @property
    def numel(self) -> int:
        return sum(entry.numel for entry in self.entries)

    def entry(self, name: str) -> CacheEntry:
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise KeyError(f"no cache entry {name!r}; known: {[e.name for e in self.entries][:8]}...")

    def to_json(self) -> list[list[Any]]:
        return [[e.name, e.offset, e.numel, list(e.shape)] for e in self.entries]

    @classmethod
    def from_json(cls, rows: Any) -> CacheLayout:
        """Rows ``[name, offset, numel, shape]``, read strictly: anything else raises :class:`StepContractError`."""
        if not isinstance(rows, list) or len(rows) > MAX_LAYOUT_ENTRIES:
            found = f"{len(rows)} rows" if isinstance(rows, list) else type(rows).__name__
            raise StepContractError(
                f"cache layout: expected a list of at most {MAX_LAYOUT_ENTRIES} rows, found {found}"
            )
        entries = []
        for row in rows:
            if not (
                isinstance(row, list)
                and len(row) == 4
                and isinstance(row[0], str)
                and all(_is_count(value) for value in row[1:3])
                and isinstance(row[3], list)
                and len(row[3]) <= MAX_LAYOUT_RANK
                and all(_is_count(size) and size <= MAX_LAYOUT_DIM for size in row[3])
            ):
                raise StepContractError(
                    f"cache layout row {str(row)[:80]} is not [name, offset, numel, shape] with counts >= 0"
                )
            entries.append(CacheEntry(row[0], row[1], row[2], tuple(row[3])))
        entries = tuple(entries)
        offset = 0
        for entry in entries:
            if entry.offset != offset or entry.numel != math.prod(entry.shape):
                raise StepContractError(
                    f"cache layout entry {entry.name!r} is inconsistent (offset {entry.offset}, "
                    f"expected {offset}; numel {entry.numel} vs shape {list(entry.shape)})"
                )
            offset += entry.numel
        return cls(entries)


@dataclass(frozen=True)
class StepContract:
    """Everything a runtime needs to drive a step graph, carried in the graph's metadata."""

    step_frames: int
    cache_numel: int
    head_dim: int
    kv_slots: int
    samples_per_frame: int  # stored as "hop" in the metadata (the name artifacts already carry)
    sample_rate: int
    num_quantizers: int
    codebook_size: int
    rope_inv_freq: tuple[float, ...]
    layout: CacheLayout = field(repr=False)
    geometry: dict[str, Any] = field(default_factory=dict, repr=False)
    schema_version: int = STEP_SCHEMA_VERSION
    max_step_frames: int | None = None  # None: a static graph; else any B in 1..max_step_frames
    codes_dtype: str = CODES_DTYPES[0]  # audio_codes' element type (numpy's name)

    @property
    def dynamic(self) -> bool:
        return self.max_step_frames is not None

    def for_frames(self, step_frames: int) -> StepContract:
        """The contract of running this graph with ``step_frames`` frames (a dynamic graph's role in a plan)."""
        if step_frames == self.step_frames:
            return self
        if not self.dynamic or not 1 <= step_frames <= self.max_step_frames:
            accepts = f"1..{self.max_step_frames}" if self.dynamic else f"exactly {self.step_frames}"
            raise StepContractError(f"this step graph takes {accepts} frames per step, not {step_frames}")
        return replace(self, step_frames=step_frames)

    def same_graph(self, other: StepContract) -> bool:
        """Whether ``other`` describes this graph, possibly run at another B (a dynamic graph's plan role)."""
        if self.dynamic and other.dynamic and other.step_frames <= self.max_step_frames:
            return replace(other, step_frames=self.step_frames) == self
        return other == self

    def input_shapes(self) -> dict[str, list[int]]:
        return {
            "audio_codes": [1, self.num_quantizers, self.step_frames],
            "freqs_in": [self.step_frames, self.head_dim // 2],
            "cache_valid": [1],
            "cache_in": [self.cache_numel],
        }

    def output_shapes(self) -> dict[str, list[int]]:
        return {"audio_values": [self.step_frames * self.samples_per_frame], "cache_out": [self.cache_numel]}

    @property
    def codec(self) -> CodecGeometry:
        return CodecGeometry(self.sample_rate, self.samples_per_frame, self.num_quantizers, self.codebook_size)

    def shares_cache_with(self, other: StepContract) -> bool:
        return self.layout == other.layout and self.rope_inv_freq == other.rope_inv_freq

    def to_metadata(self) -> dict[str, str]:
        """String key/values for ONNX ``metadata_props``."""
        values = asdict(self)
        values.pop("layout")
        if values["max_step_frames"] is None:  # static graphs keep the metadata (and bytes) they always had
            values.pop("max_step_frames")
        if values["codes_dtype"] == CODES_DTYPES[0]:  # so do graphs taking int64 codes
            values.pop("codes_dtype")
        names = {"samples_per_frame": "hop"}
        metadata = {f"qwen3_tts.{names.get(k, k)}": json.dumps(v) for k, v in values.items()}
        metadata["qwen3_tts.cache_layout"] = json.dumps(self.layout.to_json())
        metadata["qwen3_tts.input_names"] = json.dumps(list(INPUT_NAMES))
        metadata["qwen3_tts.output_names"] = json.dumps(list(OUTPUT_NAMES))
        return metadata

    def to_json(self) -> dict[str, Any]:
        """The contract as plain JSON (what an execution plan carries for a step artifact without metadata)."""
        row = {key.removeprefix("qwen3_tts."): json.loads(value) for key, value in self.to_metadata().items()}
        return {**row, "inputs": self.input_shapes(), "outputs": self.output_shapes()}

    @classmethod
    def from_json(cls, row: Mapping[str, Any], source: str = "plan") -> StepContract:
        if not isinstance(row, Mapping):
            raise StepContractError(f"{source}: a step contract is a JSON object, found {type(row).__name__}")
        shapes = ("inputs", "outputs")
        metadata = {f"qwen3_tts.{key}": json.dumps(value) for key, value in row.items() if key not in shapes}
        return cls.from_metadata(metadata, source)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str], source: str = "graph") -> StepContract:
        """The contract in a graph's ``qwen3_tts.*`` metadata (JSON values), read strictly.

        Checked in this order, the first fault raising :class:`StepContractError`: schema_version,
        rope_inv_freq, geometry, the integer fields in the step schema's order (:data:`COUNT_BOUNDS`),
        the cache layout (rows, then offsets and sizes), max_step_frames, then step_frames against it,
        the layout's sum against cache_numel, the RoPE count against head_dim, then codes_dtype. The browser's
        reader (``web/edge/stateful_decoder.mjs``) checks in the same order with the same messages.
        """

        def read(key: str) -> Any:
            try:
                return json.loads(metadata[f"qwen3_tts.{key}"])
            except (TypeError, ValueError, RecursionError) as exc:
                raise StepContractError(f"{source}: 'qwen3_tts.{key}' is not JSON ({str(exc)[:80]})") from exc
            except KeyError as exc:
                raise StepContractError(
                    f"{source} has no 'qwen3_tts.{key}' metadata: it is not a Qwen3-TTS stateful step graph "
                    "exported by vllm_omni.edge (re-export it with export_step_onnx)"
                ) from exc

        def count(key: str) -> int:
            value, (low, high) = read(key), COUNT_BOUNDS[key]
            if not _is_count(value) or not low <= value <= high:
                raise StepContractError(
                    f"{source}: {key} must be an integer in {low}..{high}, found {str(value)[:40]!r}"
                )
            return value

        version = read("schema_version")
        if version != STEP_SCHEMA_VERSION or type(version) is not int:
            raise StepContractError(
                f"{source} uses step schema {str(version)[:20]}; this runtime reads schema "
                f"{STEP_SCHEMA_VERSION}. Re-export the graph with this version."
            )
        frequencies = read("rope_inv_freq")
        if not isinstance(frequencies, list) or not all(
            type(f) in (int, float) and math.isfinite(f) for f in frequencies
        ):
            raise StepContractError(f"{source}: rope_inv_freq must be a list of finite numbers")
        geometry = read("geometry")
        if not isinstance(geometry, dict):
            raise StepContractError(f"{source}: geometry must be a JSON object, found {type(geometry).__name__}")
        counts = {key: count(key) for key in COUNT_BOUNDS if key != "max_step_frames"}
        contract = cls(
            step_frames=counts["step_frames"],
            cache_numel=counts["cache_numel"],
            head_dim=counts["head_dim"],
            kv_slots=counts["kv_slots"],
            samples_per_frame=counts["hop"],
            sample_rate=counts["sample_rate"],
            num_quantizers=counts["num_quantizers"],
            codebook_size=counts["codebook_size"],
            rope_inv_freq=tuple(float(f) for f in frequencies),
            layout=CacheLayout.from_json(read("cache_layout")),
            geometry=geometry,
            schema_version=version,
            max_step_frames=count("max_step_frames") if "qwen3_tts.max_step_frames" in metadata else None,
        )
        if contract.dynamic and contract.step_frames > contract.max_step_frames:
            raise StepContractError(
                f"{source}: step_frames {contract.step_frames} exceeds the graph's max_step_frames "
                f"{contract.max_step_frames}"
            )
        if contract.layout.numel != contract.cache_numel:
            raise StepContractError(
                f"{source}: cache layout sums to {contract.layout.numel} floats but "
                f"cache_numel is {contract.cache_numel}"
            )
        if len(contract.rope_inv_freq) != contract.head_dim // 2:
            raise StepContractError(
                f"{source}: {len(contract.rope_inv_freq)} RoPE frequencies for head_dim {contract.head_dim}"
            )
        if "qwen3_tts.codes_dtype" in metadata:
            codes_dtype = read("codes_dtype")
            if codes_dtype not in CODES_DTYPES:
                raise StepContractError(
                    f"{source}: codes_dtype must be one of {', '.join(CODES_DTYPES)}, found {str(codes_dtype)[:20]!r}"
                )
            contract = replace(contract, codes_dtype=codes_dtype)
        return contract


def _is_count(value: Any) -> bool:
    """An integer >= 0 that is not a bool (JSON ``true`` is not a size, nor is ``"16"`` or ``16.0``)."""
    return type(value) is int and value >= 0
