"""What the bridge asks of a duplex session, one class per command (vllm-omni 0.30.0 §1.2).

Audio is PCM16 little-endian mono with its rate; each engine converts to what
its model needs. ``EngineCommand`` is the union a session's ``submit`` takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AckPlayback",
    "AppendAudio",
    "BargeIn",
    "CancelResponse",
    "ClearInput",
    "ClearOutputAudio",
    "CloseSession",
    "Commit",
    "CreateResponse",
    "CreateTextItem",
    "EngineCommand",
    "FunctionCallOutput",
    "Heartbeat",
    "TruncateItem",
]


@dataclass(frozen=True, slots=True)
class AppendAudio:
    pcm: bytes
    rate_hz: int
    overlap: Literal["listen"] | None = None
    """``"listen"`` (vllm-omni 0.30's ``overlap_action``): audio that comes while a reply is in progress is heard
    (the VAD's speech events go out) but never barges in and is not kept for the turn — the bridge decides whether
    the caller interrupted (``barge_in.mode = "bridge"``, #41). Outside a reply it changes nothing."""


@dataclass(frozen=True, slots=True)
class Commit:
    """End the caller's input turn; ``create_response`` None leaves it to the engine's policy."""

    create_response: bool | None = None


@dataclass(frozen=True, slots=True)
class CreateResponse:
    pass


@dataclass(frozen=True, slots=True)
class CancelResponse:
    response_id: str | None = None


@dataclass(frozen=True, slots=True)
class BargeIn:
    """The caller talks over the agent: cancel the response, advance the epoch."""


@dataclass(frozen=True, slots=True)
class ClearOutputAudio:
    response_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClearInput:
    pass


@dataclass(frozen=True, slots=True)
class AckPlayback:
    """The caller has heard ``played_ms`` of response ``response_id`` (cumulative, from its start)."""

    response_id: str
    played_ms: int
    item_id: str | None = None


@dataclass(frozen=True, slots=True)
class TruncateItem:
    """Cut the stored assistant turn ``item_id`` to its first ``audio_end_ms`` (what was heard)."""

    item_id: str
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class CreateTextItem:
    """Add a user text item to the conversation (a DTMF digit, a note from the bridge)."""

    text: str


@dataclass(frozen=True, slots=True)
class FunctionCallOutput:
    """Answer the model's ``FunctionCall`` ``call_id``: ``output`` is text (vllm-omni 0.30 rejects anything
    else with ``invalid_function_call_output``), JSON by our convention (``{"ok": true}`` / ``{"error": …}``).
    The engine continues the conversation on its own; no ``CreateResponse`` is needed."""

    call_id: str
    output: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class CloseSession:
    reason: str = "client_close"


EngineCommand = (
    AppendAudio
    | Commit
    | CreateResponse
    | CancelResponse
    | BargeIn
    | ClearOutputAudio
    | ClearInput
    | AckPlayback
    | TruncateItem
    | CreateTextItem
    | FunctionCallOutput
    | Heartbeat
    | CloseSession
)
