"""XNNPACK's process-wide options set through the runtime's C++ set_option (ctypes), read back with get_option."""

from __future__ import annotations

import pytest

from vllm_omni.edge.backends.executorch import xnnpack_options
from vllm_omni.edge.backends.executorch.run import load_program


@pytest.fixture
def restore_options():
    yield
    xnnpack_options.set_options(weight_cache=True, workspace_sharing=xnnpack_options.WORKSPACE_SHARING_GLOBAL)


def test_options_read_back_as_set(restore_options):
    for weight_cache, sharing in ((False, 0), (True, 1), (False, 2), (True, 2)):
        found = xnnpack_options.set_options(weight_cache=weight_cache, workspace_sharing=sharing)
        assert found == {"weight_cache_enabled": weight_cache, "workspace_sharing_mode": sharing}
        assert xnnpack_options.read_options() == found


def test_an_out_of_range_option_is_refused_by_the_runtime(restore_options):
    with pytest.raises(xnnpack_options.XnnpackOptionsError, match="set_option"):
        xnnpack_options.set_options(weight_cache=True, workspace_sharing=7)


def test_loading_a_program_turns_the_weight_cache_on(phone_steps_plan, restore_options):
    xnnpack_options.set_options(weight_cache=False, workspace_sharing=0)
    xnnpack_options.share_packed_weights.cache_clear()
    load_program(phone_steps_plan / "steps.pte")
    assert xnnpack_options.read_options() == {"weight_cache_enabled": True, "workspace_sharing_mode": 2}
