"""ExecuTorch (``.pte``): export (:mod:`.export`, the partitioners in :mod:`.xnnpack_options` and
:mod:`.xnnpack_stages`), run (:mod:`.run`), how much runs in the delegate (:mod:`.delegation`), and what both
sides read of a program (:mod:`.program`). The toolchain is imported inside the functions that need it.
"""
