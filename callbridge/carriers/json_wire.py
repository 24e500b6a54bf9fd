"""What every JSON-over-websocket carrier codec does the same way: one text message is one JSON object, checked before anything reads it; fields are read with typed errors;
numbers may come as JSON numbers or as strings."""

from __future__ import annotations

import binascii
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from callbridge.carriers.base import CarrierEvent, ProtocolErrorReason, RemoteProtocolError, UnknownCarrierEvent

__all__ = ["JsonCodec", "json_number", "parse_object", "start_body"]


class JsonCodec:
    """The shared half of a JSON carrier codec; the subclass names the ``provider`` and tracks the stream."""

    provider: str
    stream_key: str
    """The field that names the stream in every message (``streamSid``, ``stream_id``, ``streamId``…)."""
    stream_id: str | None
    call_id: str | None
    stopped: bool
    max_message_bytes: int

    def _parse(self, message: str | bytes) -> dict[str, Any]:
        """One websocket message as a JSON object (see ``parse_object``)."""
        return parse_object(message, self.max_message_bytes, self._error)

    def _check_stream(self, payload: dict[str, Any], event: str, *, required: bool = True) -> None:
        """``event`` may come now (after ``start``, before ``stop``) and names this stream (``required``: the
        stream field must be there; otherwise it may be left out)."""
        if self.stream_id is None:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, f"{event} before start")
        if self.stopped:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, f"{event} after stop")
        stream_id = payload.get(self.stream_key)
        if stream_id is None and not required:
            return
        if stream_id != self.stream_id:
            reason = ProtocolErrorReason.MISSING_FIELD if stream_id is None else ProtocolErrorReason.WRONG_STREAM
            raise self._error(reason, f"{event} for stream {stream_id!r}")

    def _object(self, payload: dict[str, Any], key: str) -> dict[str, Any]:
        value = payload.get(key)
        if not isinstance(value, dict):
            raise self._error(ProtocolErrorReason.MISSING_FIELD, f"{key} object missing")
        return value

    def _string(self, body: dict[str, Any], key: str, where: str) -> str:
        value = body.get(key)
        if not isinstance(value, str) or not value:
            raise self._error(ProtocolErrorReason.MISSING_FIELD, f"{where}.{key} missing")
        return value

    def _audio(self, encoded: object) -> bytes:
        """A media message's base64 payload, decoded strictly (a character outside base64 is an error)."""
        if not isinstance(encoded, str):
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "media without a payload")
        try:
            return binascii.a2b_base64(encoded, strict_mode=True)
        except ValueError as exc:  # binascii.Error, or text that is not ASCII at all
            raise self._error(ProtocolErrorReason.BAD_BASE64, str(exc)) from None

    def _media_sequence(self, value: object, last: int) -> int:
        """A media message's sequence number, which must be a number above ``last``: the new last (``last`` itself
        where the message has none)."""
        if value is None:
            return last
        number = json_number(value)
        if number is None or number < 0:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"media.sequenceNumber {value!r}")
        if number <= last:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, f"media {number} after {last}")
        return number

    def _unknown(self, event: object) -> list[CarrierEvent]:
        """A message whose ``event`` no branch knew: an event type the carrier added (ignored, counted by the
        driver), or malformed (no event, or not a name: the stream ends)."""
        if event is None:
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "message without an event")
        if not isinstance(event, str) or not event:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"event {str(event)[:64]!r}")
        return [UnknownCarrierEvent(event[:64])]

    def _error(self, reason: ProtocolErrorReason, detail: str) -> RemoteProtocolError:
        return RemoteProtocolError(reason, detail, provider=self.provider, stream_id=self.stream_id, call_id=self.call_id)


def parse_object(
    message: str | bytes, max_bytes: int, error: Callable[[ProtocolErrorReason, str], RemoteProtocolError]
) -> dict[str, Any]:
    """One text message as a JSON object; ``error`` builds the ``RemoteProtocolError`` raised for a binary,
    oversized, non-JSON or non-object message."""
    if isinstance(message, bytes | bytearray | memoryview):
        raise error(ProtocolErrorReason.BINARY_FRAME, f"{len(message)}-byte binary frame")
    if len(message) > max_bytes:
        raise error(ProtocolErrorReason.OVERSIZED, f"{len(message)} bytes > {max_bytes}")
    try:
        payload = orjson.loads(message)
    except orjson.JSONDecodeError as exc:
        raise error(ProtocolErrorReason.NOT_JSON, str(exc)) from None
    if not isinstance(payload, dict):
        raise error(ProtocolErrorReason.NOT_AN_OBJECT, type(payload).__name__)
    return payload


def json_number(value: Any) -> int | None:
    """An integer sent as a JSON number or as a string (``"8000"``); None when it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def start_body(first: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A first message that is ``{"event": "start", …}``: its ``start`` object (empty when it has none); else None
    (for the carriers' ``recognises``)."""
    if first.get("event") != "start":
        return None
    start = first.get("start")
    return start if isinstance(start, dict) else {}
