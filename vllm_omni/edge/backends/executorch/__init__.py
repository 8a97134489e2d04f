"""ExecuTorch (``.pte``): export (:mod:`.export`, with the staged XNNPACK partitioner of :mod:`.xnnpack_stages`),
run (:mod:`.run`, with XNNPACK's process-wide options of :mod:`.xnnpack_options`: one packed copy of the weights),
how much runs in the delegate (:mod:`.delegation`), and what both sides read of a program (:mod:`.program`). The
toolchain is imported inside the functions that need it.
"""
