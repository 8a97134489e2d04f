"""Export wrappers of the Code2Wav decoder and their contracts, each contract stated once.

- :mod:`.step_contract` (no torch): the stateful step's I/O and flat-cache layout;
- :mod:`.window_contract` (no torch): the window schedule and one windowed program's I/O;
- :mod:`.stateful` and :mod:`.windowed` (torch): the ``nn.Module`` wrappers that fix those contracts.
"""
