"""The ``rknn`` builder: ONNX step graphs compiled to fp16 ``.rknn`` and checked in the simulator.

:mod:`.build` runs in the build's process and hands the compile to the converter venv, where
``vllm-omni-edge rknn-convert`` runs :mod:`.convert` (export or keep the graphs, compile),
:mod:`.check` (the simulator check, the accuracy analysis) and :mod:`.plan` (the plan). :mod:`.errors`
holds what each stage raises and the outcome statuses the builder reads back.
"""
