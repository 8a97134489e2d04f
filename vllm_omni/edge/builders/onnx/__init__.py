"""The ``onnx`` builder (:mod:`.build`): stateful ONNX step graphs, exported and checked by :mod:`.steps` (which
the ``rknn`` builder also exports through).
"""
