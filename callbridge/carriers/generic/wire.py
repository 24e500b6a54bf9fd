"""A codec that recognises the carrier from its first messages, then is that carrier's codec: for one media
URL that several carriers point at.

The first message that names its carrier decides (telephony-protocols.md §0): each websocket carrier says what
its first message looks like (``recognises`` in its ``wire.py``, named by its ``CarrierSpec``), asked in the
registry's order. A ``connected`` that comes first (several carriers send one) is held and replayed to the codec
chosen. Anything else before the carrier is known is an error, like any codec's; carriers whose media is not a
websocket have listeners of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from callbridge.carriers.base import (
    DEFAULT_PROFILE,
    CarrierAction,
    CarrierEvent,
    CarrierProfile,
    ProtocolErrorReason,
    ProviderCodec,
    RemoteProtocolError,
)
from callbridge.carriers.json_wire import parse_object

__all__ = ["Candidate", "DetectingCodec", "Recognises", "default_candidates", "recognise"]

UNKNOWN: Final = "unknown"
DEFAULT_MAX_MESSAGE_BYTES: Final = 256 * 1024
"""The largest first message read before the carrier is known (every carrier's own codec bounds the rest)."""


Recognises = Callable[[Mapping[str, Any]], bool]
"""Whether a first message (parsed JSON) is this carrier's."""


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    recognises: Recognises
    codec: Callable[[], ProviderCodec]


def default_candidates() -> tuple[Candidate, ...]:
    """Every websocket carrier of the registry that can be recognised, in the registry's order."""
    from callbridge.carriers import CARRIERS

    return tuple(
        Candidate(spec.name, spec.recogniser(), spec.codec_factory())
        for spec in CARRIERS
        if spec.transport == "websocket" and spec.codec is not None and spec.recognises is not None
    )


def recognise(payload: Mapping[str, Any], candidates: Sequence[Candidate] | None = None) -> Candidate | None:
    """The carrier a first message comes from, or None when it does not say."""
    for candidate in candidates if candidates is not None else default_candidates():
        if candidate.recognises(payload):
            return candidate
    return None


class DetectingCodec:
    """Recognise the carrier, then delegate every message to its codec (see the module docstring)."""

    def __init__(self, candidates: Sequence[Candidate] | None = None, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self._candidates = candidates if candidates is not None else default_candidates()
        self.max_message_bytes = max_message_bytes
        self.inner: ProviderCodec | None = None
        self._held: str | None = None

    @property
    def provider(self) -> str:
        return self.inner.provider if self.inner is not None else UNKNOWN

    @property
    def stream_id(self) -> str | None:
        return self.inner.stream_id if self.inner is not None else None

    @property
    def profile(self) -> CarrierProfile:
        return self.inner.profile if self.inner is not None else DEFAULT_PROFILE

    def receive_message(self, message: str | bytes) -> list[CarrierEvent]:
        if self.inner is not None:
            return self.inner.receive_message(message)
        payload = parse_object(message, self.max_message_bytes, self._error)
        if payload.get("event") == "connected" and self._held is None and isinstance(message, str):
            self._held = message
            return []
        carrier = recognise(payload, self._candidates)
        if carrier is None:
            raise self._error(ProtocolErrorReason.UNKNOWN_EVENT, f"cannot tell the carrier from event {payload.get('event')!r}")
        self.inner = carrier.codec()
        events: list[CarrierEvent] = []
        if self._held is not None:
            events += self.inner.receive_message(self._held)
            self._held = None
        events += self.inner.receive_message(message)
        return events

    def send(self, action: CarrierAction) -> str | bytes | None:
        if self.inner is None:
            raise RuntimeError("DetectingCodec.send() before the carrier is known")  # a bug in the caller
        return self.inner.send(action)

    def _error(self, reason: ProtocolErrorReason, detail: str) -> RemoteProtocolError:
        return RemoteProtocolError(reason, detail, provider=UNKNOWN)
