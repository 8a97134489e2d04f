"""``manifest.json`` of a set of windowed programs: what each file is and how to feed it (no torch).

The schema is versioned (``schema`` + ``schema_version``) and documented in
``docs/windowed_programs.md``. A manifest lists one program per window of the stream schedule
(:mod:`..graphs.window_contract`), with paths relative to the manifest, so a directory can be copied
as a whole. Readers check the schema and, before handing a file to a runtime, its size and sha256.
A build turns a manifest into an execution plan with :func:`.construct.windowed_plan`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EdgeError
from ..files import check_file, read_json_file, write_json_atomically
from ..geometry import CodecGeometry
from ..graphs.window_contract import Window, WindowContract, window_schedule

MANIFEST_SCHEMA = "vllm-omni-edge/windowed-programs"
MANIFEST_SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"


class ManifestError(EdgeError):
    """A manifest is missing, of another schema, inconsistent, or names a file that does not match it."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> TensorSpec:
        return cls(str(row["name"]), tuple(int(s) for s in row["shape"]), str(row["dtype"]))


@dataclass(frozen=True)
class ProgramEntry:
    """One program file. ``check`` holds the verification result (``None`` when run with ``--no-check``)."""

    name: str
    context_frames: int
    chunk_frames: int
    path: str
    size_bytes: int
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    export_seconds: float
    ops: dict[str, Any] | None = None  # op counts; "delegation": the lowering's DelegationReport as JSON
    check: dict[str, Any] | None = None
    method: str | None = None  # this window's method when ``path`` holds several windows (one copy of the weights)

    @property
    def window(self) -> Window:
        return Window(self.context_frames, self.chunk_frames)

    @property
    def window_frames(self) -> int:
        return self.context_frames + self.chunk_frames

    def to_json(self) -> dict[str, Any]:
        row = asdict(self)
        if self.method is None:  # a file per window: the manifest reads as before
            del row["method"]
        row["window_frames"] = self.window_frames
        row["inputs"] = [spec.to_json() for spec in self.inputs]
        row["outputs"] = [spec.to_json() for spec in self.outputs]
        return row

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> ProgramEntry:
        return cls(
            name=str(row["name"]),
            context_frames=int(row["context_frames"]),
            chunk_frames=int(row["chunk_frames"]),
            path=str(row["path"]),
            size_bytes=int(row["size_bytes"]),
            sha256=str(row["sha256"]),
            inputs=tuple(TensorSpec.from_json(r) for r in row["inputs"]),
            outputs=tuple(TensorSpec.from_json(r) for r in row["outputs"]),
            export_seconds=float(row["export_seconds"]),
            ops=row.get("ops"),
            check=row.get("check"),
            method=None if row.get("method") is None else str(row["method"]),
        )


@dataclass(frozen=True)
class WindowedManifest:
    """Everything a device needs to stream with a set of windowed programs."""

    model_id: str
    checkpoint_sha256: str
    geometry: dict[str, Any]  # the decoder config the programs were exported from
    codec: CodecGeometry
    ramp: tuple[int, ...]
    context_frames: int
    backend: str
    partitioner: str
    dtype: str
    programs: tuple[ProgramEntry, ...]
    tools: dict[str, str] = field(default_factory=dict)
    directory: Path | None = field(default=None, compare=False)

    @property
    def schedule(self) -> tuple[Window, ...]:
        return window_schedule(self.ramp, self.context_frames)

    def program(self, window: Window) -> ProgramEntry:
        for entry in self.programs:
            if entry.window == window:
                return entry
        raise ManifestError(
            f"the manifest has no program for window {window.name}; it lists {[p.name for p in self.programs]}"
        )

    def program_path(self, entry: ProgramEntry) -> Path:
        if self.directory is None:
            raise ManifestError("this manifest was not read from a directory; program paths are relative to one")
        return self.directory / entry.path

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": MANIFEST_SCHEMA,
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "model_id": self.model_id,
            "checkpoint_sha256": self.checkpoint_sha256,
            "geometry": self.geometry,
            **self.codec.to_json(),
            "ramp": list(self.ramp),
            "context_frames": self.context_frames,
            "backend": self.backend,
            "partitioner": self.partitioner,
            "dtype": self.dtype,
            "tools": self.tools,
            "programs": [entry.to_json() for entry in self.programs],
        }

    def write(self, directory: str | os.PathLike[str]) -> Path:
        return write_json_atomically(Path(directory) / MANIFEST_NAME, self.to_json())

    @classmethod
    def from_json(
        cls, payload: dict[str, Any], directory: Path | None = None, source: str = "manifest"
    ) -> WindowedManifest:
        if not isinstance(payload, dict) or payload.get("schema") != MANIFEST_SCHEMA:
            found = payload.get("schema") if isinstance(payload, dict) else type(payload).__name__
            raise ManifestError(f"{source}: expected schema {MANIFEST_SCHEMA!r}, found {found!r}")
        if payload.get("schema_version") != MANIFEST_SCHEMA_VERSION:
            raise ManifestError(
                f"{source}: schema_version {payload.get('schema_version')!r} is not supported (this reader knows "
                f"{MANIFEST_SCHEMA_VERSION}); re-export with this version of vllm-omni-edge"
            )
        try:
            manifest = cls(
                model_id=str(payload["model_id"]),
                checkpoint_sha256=str(payload["checkpoint_sha256"]),
                geometry=dict(payload["geometry"]),
                codec=CodecGeometry.from_json(payload),
                ramp=tuple(int(size) for size in payload["ramp"]),
                context_frames=int(payload["context_frames"]),
                backend=str(payload["backend"]),
                partitioner=str(payload["partitioner"]),
                dtype=str(payload["dtype"]),
                programs=tuple(ProgramEntry.from_json(row) for row in payload["programs"]),
                tools=dict(payload.get("tools", {})),
                directory=directory,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{source}: malformed manifest ({type(exc).__name__}: {exc})") from exc
        missing = [w.name for w in manifest.schedule if w not in {p.window for p in manifest.programs}]
        if missing:
            raise ManifestError(f"{source}: the ramp needs programs {missing} that the manifest does not list")
        return manifest

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> WindowedManifest:
        """Read ``path`` (a manifest file or the directory holding ``manifest.json``)."""
        path, payload = read_json_file(
            path,
            MANIFEST_NAME,
            ManifestError,
            "no manifest at {path}; export programs with `python -m vllm_omni.edge.decoder_export --out-dir DIR`",
            "re-export the programs",
        )
        return cls.from_json(payload, directory=path.parent, source=str(path))

    def verify_program(self, entry: ProgramEntry, check_sha256: bool = True) -> Path:
        """Return the program's path after checking it exists with the manifest's size (and sha256)."""
        path = self.program_path(entry)
        mismatch = check_file(path, entry.size_bytes, entry.sha256, check_sha256)
        if mismatch is None:
            return path
        if mismatch.field == "file":
            raise ManifestError(f"{entry.name}: the manifest names {path}, which does not exist; re-export")
        if mismatch.field == "size_bytes":
            raise ManifestError(
                f"{path}: expected {entry.size_bytes} bytes (manifest), found {mismatch.found}; the file is truncated "
                "or replaced: re-export or copy the directory again"
            )
        raise ManifestError(
            f"{path}: sha256 {mismatch.found[:16]}... does not match the manifest's {entry.sha256[:16]}...; the file "
            "is corrupt or from another export: re-export or copy the directory again"
        )

    def contract(self, entry: ProgramEntry) -> WindowContract:
        return WindowContract(entry.window, self.codec)
