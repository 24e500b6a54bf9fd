"""A call's setup: its context and the assistant its application chose, decided once where the call is answered
(``AnswerDesk.choose_assistant``) and kept in the registry for the call's streams, on whichever process they
reach: the stream that opens or first binds the call's engine session reads the greeting there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from callbridge.application import AssistantConfig, CallContext

__all__ = ["SETUP_NOTE", "CallSetup", "Chosen", "Rejection", "TransferTo", "setup_kept_ms"]

SETUP_NOTE = "setup"
"""The registry note (``CallRegistry.keep_note``) a call's setup is kept under."""

_KEPT_PAST_CALL_MS = 60_000
_KEPT_UNLIMITED_MS = 4 * 3600 * 1000 + _KEPT_PAST_CALL_MS


class CallSetup(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    context: CallContext
    assistant: AssistantConfig
    source: Literal["application", "fallback", "request"]
    """Whether the application chose the assistant, or the call went on with ``app.on_failure``'s."""
    chosen_at: float = 0.0
    """Unix time (s) the assistant was chosen: the call's start for its ``max_duration_s`` (0: not known)."""


@dataclass(frozen=True, slots=True)
class TransferTo:
    """The application sends the call on, unanswered by the agent: to an E.164 number or a SIP URI."""

    target: str


Rejection = Literal["busy", "hang_up"]
Chosen = CallSetup | Rejection | TransferTo
"""What the application made of a new call (``AnswerDesk.choose_assistant``)."""


def setup_kept_ms(max_call_duration_s: float) -> int:
    """How long the registry keeps a call's setup: the longest call, and a minute (four hours with no limit)."""
    return int(max_call_duration_s * 1000) + _KEPT_PAST_CALL_MS if max_call_duration_s else _KEPT_UNLIMITED_MS
