"""The ``executorch`` builder (:mod:`.build`): the stateful step as one multi-method ``.pte``."""
