"""Building artifacts for devices: export, verification and the per-class builders (torch lives here).

:func:`.registry.build` runs the builder a hardware class names, each named as the module or folder that holds it:
:mod:`.windowed` (windowed programs), :mod:`.onnx` (stateful ONNX step graphs), :mod:`.executorch` (the stateful
step as one ``.pte``), :mod:`.rknn` (the ONNX steps compiled for a Rockchip NPU in the converter venv). What they
share: :mod:`.request`, :mod:`.state` (resumable builds), :mod:`.steps` (step sizes, the check of any step runner),
:mod:`.plans`. Every builder leaves a validated execution plan.
"""
