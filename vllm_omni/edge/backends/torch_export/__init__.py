"""torch.export (``.pt2``): the ``torch.export`` program itself, written (:mod:`.export`) and run (:mod:`.run`)
by torch. The window's metadata travels in the archive as the extra file ``qwen3_tts_window.json``.
"""
