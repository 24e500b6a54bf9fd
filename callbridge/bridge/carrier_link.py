"""A call stream's side of the carrier's connection, sans-I/O (``CallSession`` composes it): whether the carrier
still listens (nothing goes to it once a send failed), the hang-up the carrier's way (REST by the driver, in
band, or by closing the socket), and the socket's close, once, with its code."""

from __future__ import annotations

from typing import Final

from callbridge.bridge.call_outputs import BargeInFlushed, CallOutput, CloseTransport, HangUpCall, ToCarrier
from callbridge.carriers.base import HangUp, HangUpMode, ProviderCodec

__all__ = ["SEND_FAILED_READ_MS", "CarrierLink"]

SEND_FAILED_READ_MS: Final = 1000
"""After a send to the carrier fails, how long the carrier's last messages (a ``stop`` sent before it closed)
may still be read before the stream is taken for dropped."""
_NORMAL_CLOSURE: Final = 1000
_GOING_AWAY: Final = 1001
_POLICY_VIOLATION: Final = 1008


class CarrierLink:
    """The carrier's connection of one stream. See the module docstring."""

    __slots__ = ("codec", "hangup", "closed", "going_away", "send_failed_at_ms", "_out")

    def __init__(self, codec: ProviderCodec, out: list[CallOutput]) -> None:
        self.codec = codec
        self.hangup: HangUp | None = None
        """The REST hang-up asked of the driver, if any."""
        self.closed = False
        """The socket is to be closed (``CloseTransport`` went out)."""
        self.going_away = False
        """Closed going away (1001): the stream moved or was superseded, the carrier reconnects (no ``stop``)."""
        self.send_failed_at_ms: int | None = None
        """When a send to the carrier failed (its side is closed), if one did."""
        self._out = out

    def send_failed(self, now_ms: int) -> bool:
        """A send to the carrier failed: nothing more goes to it (what is queued goes too). False if it was known."""
        if self.send_failed_at_ms is not None:
            return False
        self.send_failed_at_ms = now_ms
        self.drop_messages()
        return True

    def read_until_ms(self) -> int | None:
        """After a failed send, until when the carrier's last messages may still be read (``SEND_FAILED_READ_MS``)."""
        return None if self.send_failed_at_ms is None else self.send_failed_at_ms + SEND_FAILED_READ_MS

    def drop_messages(self) -> None:
        """Nothing reaches the carrier any more: its messages go (and a flush whose clear is never sent)."""
        self._out[:] = [output for output in self._out if not isinstance(output, (ToCarrier, BargeInFlushed))]

    def hang_up(self, reason: str) -> None:
        """End the phone call the carrier's way: REST by the driver, or in band (closing the socket: the caller)."""
        mode = self.codec.profile.hang_up
        if mode is HangUpMode.REST:
            self.hangup = HangUp(reason)
            self._out.append(HangUpCall(reason))
        elif mode is HangUpMode.IN_BAND:
            message = self.codec.send(HangUp(reason))
            if message is not None:
                self._out.append(ToCarrier(message))

    def close_code(self, *, policy_violation: bool) -> int:
        """The socket's close code: a policy violation (a protocol error, someone else's token), going away for a
        stream moved or superseded, else normal."""
        if policy_violation:
            return _POLICY_VIOLATION
        return _GOING_AWAY if self.going_away else _NORMAL_CLOSURE

    def close(self, code: int) -> None:
        """Close the socket with ``code`` (once)."""
        if not self.closed:
            self.closed = True
            self._out.append(CloseTransport(code))
