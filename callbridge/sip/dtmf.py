"""RFC 4733 telephone-events (telephony-protocols.md §5.4): receive digits once, send them the RFC's way.

Payload: ``event`` (8 bits) | E (1) | R (1) | volume (6) | duration (16, in
timestamp units). Every packet of one event carries the event's start
timestamp; the end packet (E=1) is repeated three times. ``DtmfReceiver``
reports a digit once per (SSRC, timestamp): on its first packet with E=1, or
on the first packet of the next event when every end packet was lost.
``dtmf_packets`` builds one digit's packets; ``dtmf_train`` schedules a
string of digits on the media clock.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from callbridge.sip.rtp import RtpPacket, RtpSender

__all__ = ["DIGITS", "DtmfReceiver", "dtmf_packets", "dtmf_train", "event_payload"]

DIGITS: Final = "0123456789*#ABCD"
"""Event codes 0–15 in order (16 is flash, not a digit)."""
_REMEMBERED: Final = 32


def event_payload(event: int, *, end: bool, duration: int, volume: int = 10) -> bytes:
    return bytes((event, (0x80 if end else 0) | (volume & 0x3F))) + (duration & 0xFFFF).to_bytes(2, "big")


class DtmfReceiver:
    """Digits from telephone-event packets, each once (module docstring)."""

    def __init__(self) -> None:
        self._seen: deque[tuple[int, int]] = deque(maxlen=_REMEMBERED)
        self._open: tuple[int, int, int] | None = None
        """(ssrc, timestamp, event) of an event whose end packet has not come yet."""
        self.malformed = 0

    def receive(self, packet: RtpPacket) -> list[str]:
        """The digits ``packet`` completes (usually none or one)."""
        payload = packet.payload
        if len(payload) < 4:
            self.malformed += 1
            return []
        event, end = payload[0], bool(payload[1] & 0x80)
        key = (packet.ssrc, packet.timestamp)
        digits: list[str] = []
        if self._open is not None and self._open[:2] != key:  # a new event and the last one never ended
            digits.extend(self._report(self._open))
        if key in self._seen:
            return digits  # an end repeat, or an update after the end
        if end:
            self._open = None
            digits.extend(self._report((packet.ssrc, packet.timestamp, event)))
        else:
            self._open = (packet.ssrc, packet.timestamp, event)
        return digits

    def _report(self, event: tuple[int, int, int]) -> list[str]:
        self._open = None
        self._seen.append(event[:2])
        code = event[2]
        return [DIGITS[code]] if code < len(DIGITS) else []


def dtmf_packets(
    sender: RtpSender, payload_type: int, digit: str, *, duration_ms: int = 100, step_ms: int = 20, event_hz: int = 8000,
    media_hz: int = 8000,
) -> list[bytes]:
    """The packets of one digit: updates every ``step_ms`` (the first with the marker), then the end packet
    three times (RFC 4733 §2.5.1.4). The caller sends them ``step_ms`` apart; the media timestamp then moves
    past the event (``sender.timestamp`` advances by its duration). Durations count in telephone-event's clock
    (``event_hz``, as negotiated), the timestamp in the audio's (``media_hz``: Opus's is 48000, and a peer may
    have offered telephone-event at 8000 beside it)."""
    code = DIGITS.index(digit.upper())
    start = sender.timestamp
    total, step = duration_ms * event_hz // 1000, step_ms * event_hz // 1000
    packets: list[bytes] = []
    for elapsed in range(step, total, step):
        packets.append(sender.event_packet(payload_type, event_payload(code, end=False, duration=elapsed), start, marker=not packets))
    end = event_payload(code, end=True, duration=total)
    for _ in range(3):
        packets.append(sender.event_packet(payload_type, end, start, marker=not packets))
    sender.timestamp = (start + duration_ms * media_hz // 1000) & 0xFFFFFFFF
    return packets


def dtmf_train(
    sender: RtpSender, payload_type: int, digits: str, *, duration_ms: int = 100, pause_ms: int = 100, step_ms: int = 20,
    event_hz: int = 8000, media_hz: int = 8000,
) -> tuple[list[tuple[int, bytes]], int]:
    """Packets for ``digits`` with the ms (from now) each is due, and how long the train lasts.

    Digit k is an event starting ``k * (duration_ms + pause_ms)`` after the media clock's position now
    (``sender.timestamp``); its packets go ``step_ms`` apart, each reporting the duration so far, the end
    packet three times (RFC 4733 §2.5.1.4), all within the pause. Afterwards the media clock stands at the
    train's end, as if audio had been sent all along, and the next audio packet starts a talk-spurt. Send no
    audio while the train plays (its timestamps would overlap the events'). The clocks: as ``dtmf_packets``.
    """
    period_ms = duration_ms + pause_ms
    if pause_ms < 3 * step_ms:
        raise ValueError("the pause must hold the three end packets")
    base = sender.timestamp
    schedule: list[tuple[int, bytes]] = []
    clocks = {"event_hz": event_hz, "media_hz": media_hz}
    for k, digit in enumerate(digits):
        sender.timestamp = (base + k * period_ms * media_hz // 1000) & 0xFFFFFFFF
        for i, packet in enumerate(dtmf_packets(sender, payload_type, digit, duration_ms=duration_ms, step_ms=step_ms, **clocks)):
            schedule.append((k * period_ms + (i + 1) * step_ms, packet))
    total_ms = len(digits) * period_ms
    sender.timestamp = (base + total_ms * media_hz // 1000) & 0xFFFFFFFF
    sender.talk_spurt = True
    return schedule, total_ms
