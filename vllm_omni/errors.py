"""The one base error of the package, importable by every layer (the model code included).

:class:`EdgeError` lives here rather than in :mod:`vllm_omni.edge.errors` because the model code
(``vllm_omni.model_executor``) must not import the edge subsystem, yet its decoder errors
(bad configs, codes, weights) are edge errors too: a command line that catches ``EdgeError``
turns every one of them into one ``error:`` line instead of a traceback.
:mod:`vllm_omni.edge.errors` re-exports it; import it from there in edge code.
"""


class EdgeError(Exception):
    """Base of every error the edge subsystem and the Code2Wav decoder it exports raise on purpose."""
