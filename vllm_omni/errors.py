"""The one base error of the package, importable by every layer (the model code included).

:class:`EdgeError` lives here rather than in :mod:`vllm_omni.edge.errors` because the model code
(``vllm_omni.model_executor``) must not import the edge subsystem, yet its decoder errors
(bad configs, codes, weights) are edge errors too: a command line that catches ``EdgeError``
turns every one of them into one ``error:`` line instead of a traceback.
:mod:`vllm_omni.edge.errors` re-exports it; import it from there in edge code.
"""


class EdgeError(Exception):
    """Base of every error the edge subsystem and the Code2Wav decoder it exports raise on purpose."""


class RequestRefused(EdgeError):
    """A request a server refuses, whichever layer found out why (the talker's prompt builder, the speech API's
    checks, the voice store): ``status`` (HTTP; 400 unless given) and a message that says what to send instead.
    The serving routes answer every one with OpenAI's error body, the WebSocket with its message."""

    status = 400
    retry_after_s: float | None = None  # a refusal for now (503): when to try again (the ``Retry-After`` header)

    def __init__(self, message: str, status: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s
