"""ONNX and onnxruntime: export step graphs (:mod:`.export`, with the CPU rewrites of :mod:`.cpu_rewrites`),
read a graph back without torch (:mod:`.graph`), and run it (:mod:`.run`, with the device's cache of optimized
graphs in :mod:`.session_cache`). Only :mod:`.export` imports torch, inside the function.
"""
