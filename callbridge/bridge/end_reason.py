"""How a stream (and its call) ended: one enum of every kind of end, and ``EndCause``, a kind with its detail (the
engine's own reason, the carrier's hang-up cause, which protocol rule, what the application answered).

An ``EndCause`` is written ``kind`` or ``kind:detail`` wherever it leaves the process (the registry's ended reason,
a signal to another process, the call's report, the log) — as end reasons always were — and it is a ``str`` of
that form, so every such place takes it unchanged. What decides on an end reads its ``kind`` and ``detail``; none
splits the text. Text that comes back from outside (the registry, another process's signal, a carrier's webhook)
becomes one again through ``EndCause.of``, the one place that reads the form.
"""

from __future__ import annotations

import enum

__all__ = ["EndCause", "EndReason"]


class EndReason(enum.StrEnum):
    """Every kind of end of a stream. The lifecycle tells some apart (a token not ours, a call already over, the
    registry unreachable, a drop the carrier may come back from); the report says who ended the call from it
    (``call_report.ended_by``); the metrics count by it."""

    # the caller or the carrier
    CALLER_HUNG_UP = "caller_hung_up"
    """The carrier's ``stop`` (or its webhook's hang-up; the detail: the carrier's cause, where it gives one)."""
    TRANSPORT_LOST = "transport_lost"
    """The socket went without a stop: the carrier may come back, the session waits for it."""
    STREAM_STOPPED = "stream_stopped"
    """The carrier stopped the stream (as an older process named a stop)."""
    NO_RECONNECT = "no_reconnect"
    """A carrier that reconnects within a window did not: its parked session is closed (``CloseUnlessBack``)."""
    PROTOCOL_ERROR = "protocol_error"
    """A carrier message broke the protocol (the detail: which rule, ``ProtocolErrorReason``)."""
    # the agent
    AGENT_HUNG_UP = "agent_hung_up"
    CALLER_SILENT = "caller_silent"
    """The agent said goodbye to a caller who said nothing, then hung up."""
    TRANSFERRED = "transferred"
    MACHINE_DETECTED = "machine_detected"
    """A call the agent placed reached an answering machine, and its ``machine_detection`` is ``hang_up``."""
    VOICEMAIL_LEFT = "voicemail_left"
    """A call the agent placed reached an answering machine: the voicemail message played after its beep."""
    # the engine
    ENGINE_SESSION_CLOSED = "engine_SessionClosed"
    """The engine closed the session (the detail: its reason)."""
    ENGINE_SESSION_EXPIRED = "engine_SessionExpired"
    """The engine expired the session (the detail: its reason)."""
    ENGINE_STREAM_FAILED = "engine_stream_failed"
    """The bridge could not read the session's events."""
    ENGINE_UNAVAILABLE = "engine_unavailable"
    """No engine took the call's stream (the detail: the engine's code)."""
    ENGINE_FAILED = "engine_failed"
    SESSION_REPLACED = "session_replaced"
    """A newer stream took the session over: this one ended quietly, the call goes on there."""
    # the bridge
    BAD_TOKEN = "bad_token"
    CALL_ALREADY_ENDED = "call_already_ended"
    REGISTRY_UNAVAILABLE = "registry_unavailable"
    APPLICATION_REJECTED = "application_rejected"
    """The application refused the call (the detail: how)."""
    CALL_ENDED = "call_ended"
    """A session closed with no more particular reason."""
    BRIDGE_SHUTDOWN = "bridge_shutdown"
    """A lone process's drain ran out with the call still up: the tone, then the carrier's hang-up."""
    MAX_CALL_DURATION = "max_call_duration"
    ASSISTANT_MAX_DURATION = "assistant_max_duration"
    FIRST_MESSAGE_TIMEOUT = "first_message_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    UNKNOWN = "unknown"
    """Text from outside that names no kind here (an older process's): kept whole as the detail, and written as it
    came."""


class EndCause(str):
    """An end: its ``kind`` and ``detail`` (empty where there is none), written ``kind`` or ``kind:detail``."""

    kind: EndReason
    detail: str

    def __new__(cls, kind: EndReason, detail: str = "") -> EndCause:
        text = detail if kind is EndReason.UNKNOWN else f"{kind.value}:{detail}" if detail else kind.value
        cause = super().__new__(cls, text)
        cause.kind, cause.detail = kind, detail
        return cause

    @classmethod
    def of(cls, text: str) -> EndCause:
        """``text`` from outside (the registry, another process, a carrier's webhook) as a cause: its kind where it
        names one, else ``UNKNOWN`` with the whole text as the detail."""
        if isinstance(text, EndCause):
            return text
        kind, _, detail = text.partition(":")
        try:
            return cls(EndReason(kind), detail)
        except ValueError:
            return cls(EndReason.UNKNOWN, text)

    def __reduce__(self) -> tuple[type[EndCause], tuple[EndReason, str]]:
        return EndCause, (self.kind, self.detail)
