"""XNNPACK's process-wide runtime options, set from Python through the ExecuTorch runtime's C++ ``set_option``.

Every XNNPACK delegate packs its weights into its own buffers when its method loads, so a program
whose methods share one copy of the weights on disk (the step sizes of ``steps.pte``, the windows
of ``windows.pte``) held one packed copy per loaded method. The XNNPACK backend of the
``executorch`` wheel has a weight cache that packs each named weight once for every delegate of
the process (``weight_cache_enabled``, off by default in the 1.5.1 wheel) and shares one workspace
across them (``workspace_sharing_mode``, already global there; set anyway, as the default varies
between builds). The Python bindings expose neither; they are options of the backend registry,
``executorch::runtime::set_option("XnnpackBackend", options)``, exported by the ``libexecutorch.so``
the bindings loaded. This module calls it with ctypes.

The ``BackendOption`` layout (a 64-byte key, then ``std::variant<bool, int, std::array<char, 256>>``)
is that of the headers shipped with executorch 1.5.1; on another version nothing is set and a
warning says so (a runtime built from source sets the same defaults with
``-DEXECUTORCH_XNNPACK_ENABLE_WEIGHT_CACHE=ON`` and ``-DEXECUTORCH_XNNPACK_SHARED_WORKSPACE=ON``).
Each option is read back with ``get_option`` after it is set: a value that does not read back is a
layout mismatch, reported, never assumed.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from importlib import metadata

logger = logging.getLogger(__name__)

VERIFIED_EXECUTORCH = "1.5.1"
BACKEND_KEY = b"XnnpackBackend"
WEIGHT_CACHE_KEY = b"weight_cache_enabled"
WORKSPACE_SHARING_KEY = b"workspace_sharing_mode"
WORKSPACE_SHARING_GLOBAL = 2  # Disabled 0, PerModel 1, Global 2
_SET_OPTION = "_ZN10executorch7runtime10set_optionEPKcNS0_4SpanINS0_13BackendOptionEEE"
_GET_OPTION = "_ZN10executorch7runtime10get_optionEPKcNS0_4SpanINS0_13BackendOptionEEE"
_BOOL, _INT = 0, 1  # variant alternatives


class _Storage(ctypes.Union):
    _fields_ = [("boolean", ctypes.c_bool), ("integer", ctypes.c_int), ("text", ctypes.c_char * 256)]


class _OptionValue(ctypes.Structure):
    """libstdc++'s ``std::variant``: the storage, then a one-byte alternative index (size 260, aligned to 4)."""

    _fields_ = [("storage", _Storage), ("index", ctypes.c_ubyte)]


class _BackendOption(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char * 64), ("value", _OptionValue)]


class XnnpackOptionsError(RuntimeError):
    """The runtime refused an option, or it did not read back as set."""


def _runtime_library() -> ctypes.CDLL:
    """``libexecutorch.so`` as the bindings loaded it: the handle of the copy already in the process
    (``RTLD_NOLOAD``), so the options land in the registry the runtime reads, never in a second copy."""
    import torch  # noqa: F401  (loads libtorch, which the bindings link against)
    from executorch.extension.pybindings import _C  # noqa: F401  (maps libexecutorch.so)

    return ctypes.CDLL("libexecutorch.so", mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)


def _call(function: str, options: ctypes.Array) -> int:
    entry = getattr(_runtime_library(), function)
    # Span<BackendOption> by value: {data, length}, trivially copyable, so two integer registers.
    entry.argtypes = [ctypes.c_char_p, ctypes.POINTER(_BackendOption), ctypes.c_size_t]
    entry.restype = ctypes.c_uint32
    return entry(BACKEND_KEY, options, len(options))


def _options(values: dict[bytes, bool | int]) -> ctypes.Array:
    options = (_BackendOption * len(values))()
    for option, (key, value) in zip(options, values.items(), strict=True):
        option.key = key
        if isinstance(value, bool):
            option.value.storage.boolean, option.value.index = value, _BOOL
        else:
            option.value.storage.integer, option.value.index = value, _INT
    return options


def read_options() -> dict[str, bool | int]:
    """The weight-cache and workspace-sharing options as the runtime holds them now."""
    options = _options({WEIGHT_CACHE_KEY: False, WORKSPACE_SHARING_KEY: -1})
    status = _call(_GET_OPTION, options)
    if status != 0:
        raise XnnpackOptionsError(f"get_option(XnnpackBackend) returned error {status:#x}")
    return {
        "weight_cache_enabled": bool(options[0].value.storage.boolean),
        "workspace_sharing_mode": int(options[1].value.storage.integer),
    }


def set_options(weight_cache: bool, workspace_sharing: int) -> dict[str, bool | int]:
    """Set both options for every XNNPACK delegate loaded from now on; returns them as read back."""
    status = _call(_SET_OPTION, _options({WEIGHT_CACHE_KEY: weight_cache, WORKSPACE_SHARING_KEY: workspace_sharing}))
    if status != 0:
        raise XnnpackOptionsError(f"set_option(XnnpackBackend) returned error {status:#x}")
    found = read_options()
    expected = {"weight_cache_enabled": weight_cache, "workspace_sharing_mode": workspace_sharing}
    if found != expected:
        raise XnnpackOptionsError(f"XNNPACK options read back as {found}, not {expected} (a layout mismatch)")
    return found


@functools.cache
def share_packed_weights() -> bool:
    """Turn on the weight cache and one shared workspace for the process, once; False where it cannot.

    Called before a program's methods load. On an executorch other than the verified version, or
    when the runtime refuses, each method keeps its own packed copy and a warning says so.
    """
    version = metadata.version("executorch")
    if version != VERIFIED_EXECUTORCH:
        logger.warning(
            "executorch %s is not %s, whose option layout this was checked against: XNNPACK's weight cache stays "
            "off, so each loaded method packs its own copy of the weights",
            version,
            VERIFIED_EXECUTORCH,
        )
        return False
    try:
        set_options(weight_cache=True, workspace_sharing=WORKSPACE_SHARING_GLOBAL)
    except (OSError, AttributeError, XnnpackOptionsError) as exc:
        logger.warning("XNNPACK's weight cache could not be switched on (%s): each method packs its own weights", exc)
        return False
    return True
