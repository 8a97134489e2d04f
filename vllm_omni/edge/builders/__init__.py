"""Building artifacts for devices: export, verification and the per-class builders (torch lives here).

:func:`.registry.build` runs the builder a hardware class names; :mod:`.windowed` exports windowed programs,
:mod:`.steps` stateful step graphs, :mod:`.rockchip` compiles them for a Rockchip NPU through
:mod:`.rknn_convert` in the converter venv. Every builder leaves a validated execution plan.
"""
