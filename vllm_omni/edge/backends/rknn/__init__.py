"""Rockchip NPUs: compile a step graph with rknn-toolkit2 (:mod:`.convert`, converter venv), run an ``.rknn`` on a
board or in the PC simulator (:mod:`.run`), and the toolkit's errors (:mod:`.errors`).
"""
