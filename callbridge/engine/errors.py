"""Engine errors: one exception type carrying vllm-omni's error codes.

    EngineError                     an engine refused or failed a session operation
      code: str                     vllm-omni's code (``resource_exhausted``, ``session_resume_expired``…)
      retryable: bool               another try (or another server) may succeed
      session_id: str | None
      refused: bool                 connection_failed because the server's port refused it (nothing listens)

Errors raised while *opening*, *resuming* or on a closed session are raised
as ``EngineError``; errors about one command on a live session arrive as an
``EngineErrorEvent`` on the session's event stream (the session goes on), as
vllm-omni does.
"""

from __future__ import annotations

from typing import Final

__all__ = ["FATAL_RESUME_CODES", "RETRYABLE_CODES", "EngineError", "ErrorCode"]


class ErrorCode:
    """The codes callbridge acts on (vllm-omni 0.30.0 §3.3–3.4); any other string may also appear."""

    RESOURCE_EXHAUSTED: Final = "resource_exhausted"
    INPUT_BACKPRESSURE: Final = "input_backpressure"
    TIMEOUT: Final = "timeout"
    ENGINE_BACKPRESSURE: Final = "engine_backpressure"
    SESSION_CLOSED: Final = "session_closed"
    UNKNOWN_SESSION: Final = "unknown_session"
    SESSION_RESUME_CONFLICT: Final = "session_resume_conflict"
    SESSION_RESUME_EXPIRED: Final = "session_resume_expired"
    INVALID_SESSION_RESUME: Final = "invalid_session_resume"
    UNSUPPORTED_SESSION_RESUME: Final = "unsupported_session_resume"
    INVALID_RESUME_TOKEN: Final = "invalid_resume_token"
    RUNTIME_RESUME_FAILED: Final = "runtime_resume_failed"
    RESYNC_REQUIRED: Final = "session_resync_required"
    INVALID_SESSION_CONFIG: Final = "invalid_session_config"
    UNSUPPORTED_AUDIO_FORMAT: Final = "unsupported_audio_format"
    UNSUPPORTED_TURN_DETECTION: Final = "unsupported_turn_detection"
    RESPONSE_ALREADY_ACTIVE: Final = "response_already_active"
    RESPONSE_NOT_ACTIVE: Final = "response_not_active"
    RESPONSE_CREATE_WITHOUT_INPUT: Final = "response_create_without_input"
    INPUT_AUDIO_BUFFER_EMPTY: Final = "input_audio_buffer_empty"
    PLAYBACK_ACK_TOO_LATE: Final = "playback_ack_too_late"
    PLAYBACK_ITEM_MISMATCH: Final = "playback_item_mismatch"
    PLAYBACK_ITEM_NOT_FOUND: Final = "playback_item_not_found"
    ITEM_NOT_FOUND: Final = "item_not_found"
    INVALID_FUNCTION_CALL_OUTPUT: Final = "invalid_function_call_output"
    BARGE_IN_UNSUPPORTED: Final = "barge_in_unsupported"
    SERVER_VAD_UNAVAILABLE: Final = "server_vad_unavailable"
    BAD_EVENT: Final = "bad_event"
    BAD_AUDIO: Final = "bad_audio"
    INVALID_JSON: Final = "invalid_json"
    UNKNOWN_EVENT: Final = "unknown_event"
    EVENT_TOO_LARGE: Final = "event_too_large"
    CONFIG_TIMEOUT: Final = "config_timeout"
    INVALID_EVENT_ACK: Final = "invalid_event_ack"
    INTERNAL_ERROR: Final = "internal_error"
    CONNECTION_FAILED: Final = "connection_failed"
    """callbridge's own: the engine server could not be reached or the socket was lost past resume."""
    PROTOCOL_ERROR: Final = "protocol_error"
    """callbridge's own: the engine server sent something the wire protocol does not allow."""


RETRYABLE_CODES: Final = frozenset(
    {
        ErrorCode.RESOURCE_EXHAUSTED,
        ErrorCode.INPUT_BACKPRESSURE,
        ErrorCode.TIMEOUT,
        ErrorCode.ENGINE_BACKPRESSURE,
        ErrorCode.CONNECTION_FAILED,
    }
)

FATAL_RESUME_CODES: Final = frozenset(
    {
        ErrorCode.INVALID_SESSION_RESUME,
        ErrorCode.SESSION_RESUME_EXPIRED,
        ErrorCode.UNSUPPORTED_SESSION_RESUME,
        ErrorCode.INVALID_RESUME_TOKEN,
        ErrorCode.SESSION_RESUME_CONFLICT,
        ErrorCode.RESYNC_REQUIRED,
    }
)
"""A resume that fails with one of these will never succeed: the session is gone for this call."""


class EngineError(Exception):
    """An engine refused or failed a session operation."""

    def __init__(
        self,
        code: str,
        message: str = "",
        *,
        retryable: bool | None = None,
        session_id: str | None = None,
        refused: bool = False,
    ) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message
        self.retryable = code in RETRYABLE_CODES if retryable is None else retryable
        self.session_id = session_id
        self.refused = refused
