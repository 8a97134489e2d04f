"""Export wrappers of the Code2Wav decoder and their contracts, each contract stated once.

- :mod:`.step_contract` (no torch): the stateful step's I/O and flat-cache layout;
- :mod:`.window_contract` (no torch): the window schedule and one windowed program's I/O;
- :mod:`.stateful` and :mod:`.windowed` (torch): the ``nn.Module`` wrappers that fix those contracts.
- :mod:`.layouts` (no torch): the one registry of the step's formulations (:mod:`.stateful`'s own,
  :mod:`.npu_layout` for the Rockchip NPU, :mod:`.phone_layout` for XNNPACK), by the name graphs and plans carry.
"""
