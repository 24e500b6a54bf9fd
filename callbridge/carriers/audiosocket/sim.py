"""A simulated Asterisk running ``AudioSocket()``, faithful to the wire (telephony-protocols.md §4.1, §7).

It does what Asterisk's ``app_audiosocket`` / ``res_audiosocket`` do for a call
that the dialplan sends to the bridge::

    exten => _X.,1,Answer()
     same => n,Set(CALLBRIDGE_ID=${UUID()})
     same => n,Set(TRIES=0)
     same => n(media),TryExec(AudioSocket(${CALLBRIDGE_ID},bridge:9092))
     same => n,Set(TRIES=$[${TRIES} + 1])
     same => n,GotoIf($[${TRIES} < 3]?media)
     same => n,Hangup()

- connects over TCP (Asterisk is the client), sends the uuid frame (16 raw
  bytes), then a 20 ms signed-linear little-endian frame every 20 ms at real
  time: kind ``0x10`` (8 kHz, what the app forces) or another slin kind (the
  channel driver's codec, e.g. ``0x12`` slin16); DTMF as kind ``0x03`` + one
  ASCII byte;
- ends a session by closing the socket (current Asterisk never sends ``0x00``):
  the bridge cannot tell the caller hanging up from a drop;
- plays what the bridge sends at once — there is no queue to flush and no
  marker — so audio that arrives ahead of real time would overlap: how far
  ahead the bridge ever got is recorded (``max_ahead_ms``) and anything beyond
  the bridge's lead and a frame of jitter is a warning;
- treats ``0x00`` from the bridge as the bridge hanging up; records any kind
  other than hangup/audio, an empty audio frame ("Invalid message length") and
  audio of another kind than the stream's as protocol warnings — Asterisk
  would end the session on the first two;
- after a drop (or the bridge closing), the dialplan loop above runs
  ``AudioSocket()`` again with the same uuid, at most three times per call. An
  in-band hang-up ends the call here: the real dialplan would loop back too,
  and the bridge refuses the ended call at once (tests/bridge/test_audiosocket_e2e.py).

There are no credentials: the bridge admits by source address. Forged access
is a connection from 127.0.0.2, outside the bridge's ``allowed_sources``.
"""

from __future__ import annotations

import asyncio
import audioop
import contextlib
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from callbridge.carriers.audiosocket.wire import AUDIO_KINDS, PROFILE, Kind, frame
from callbridge.config import Settings
from callbridge.sim.carrier import (
    FRAME_MS,
    OpenReason,
    SimCall,
    SimStream,
    SimulatedCarrier,
)
from callbridge.sim.ports import free_port

__all__ = ["AudioSocketStream", "SimulatedAudioSocket", "TcpConnection"]

MAX_AHEAD_MS = (PROFILE.lead_ms or FRAME_MS) + 2 * FRAME_MS
"""Beyond this, audio reached Asterisk so far ahead of real time that the caller would hear it overlap (the
bridge's lead, the sim's tick phase and a frame of scheduling jitter)."""


class TcpConnection:
    """Asterisk's end of one AudioSocket TCP connection as a ``SimConnection``: chunks of the byte stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.closed = False

    async def send(self, message: str | bytes) -> None:
        if self.closed or self.writer.is_closing():
            raise ConnectionError("AudioSocket connection closed")
        if isinstance(message, str):
            raise TypeError("AudioSocket carries bytes only")
        try:
            self.writer.write(message)  # one write per frame, as res_audiosocket does
            await self.writer.drain()
        except OSError as exc:
            raise ConnectionError(str(exc)) from None

    async def messages(self) -> AsyncIterator[str | bytes]:
        while True:
            try:
                chunk = await self.reader.read(65536)
            except OSError:
                return
            if not chunk:
                return
            yield chunk

    def abort(self) -> None:
        self.closed = True
        self.writer.transport.abort()

    async def close(self) -> None:
        self.closed = True
        self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)

    @property
    def close_code(self) -> int | None:
        return None  # TCP has no close code


class AudioSocketStream(SimStream):
    """One ``AudioSocket()`` session: slin frames out at real time, the bridge's frames parsed as they arrive."""

    marks_echoed_on_clear: ClassVar[bool] = False

    def __init__(self, conn: TcpConnection, stream_id: str, call: SimCall, carrier: SimulatedAudioSocket, kind: int) -> None:
        super().__init__(conn, stream_id, AUDIO_KINDS[kind], call)
        self.carrier = carrier
        self.kind = kind
        self.max_ahead_ms = 0.0
        self.hangup_received = False
        self._rest = bytearray()
        self._resample_state: Any = None
        self._ahead_warned = False

    async def send_audio(self, pcm_8k: bytes) -> None:
        if self.rate_hz != 8000:
            pcm_8k, self._resample_state = audioop.ratecv(pcm_8k, 2, 1, 8000, self.rate_hz, self._resample_state)
            pcm_8k = pcm_8k[: self.frame_bytes].ljust(self.frame_bytes, b"\x00")
        await self.send(frame(self.kind, pcm_8k))

    async def send_dtmf(self, digit: str) -> None:
        await self.send(frame(Kind.DTMF, digit.encode("ascii")))

    async def send_stop(self) -> None:
        """The channel hung up: ``AudioSocket()`` returns and Asterisk closes the socket, saying nothing."""
        self.dropped = True
        await self.conn.close()

    def mark_message(self, name: str) -> None:
        return None  # never called: Asterisk has no markers

    def receive(self, message: str | bytes) -> None:
        if self.hangup_received:
            return  # AudioSocket() has returned: nothing more is read
        if isinstance(message, str):
            self.warn("text on an AudioSocket connection")
            return
        self._rest += message
        while len(self._rest) >= 3:
            kind, length = self._rest[0], int.from_bytes(self._rest[1:3], "big")
            if len(self._rest) < 3 + length:
                return
            payload = bytes(self._rest[3 : 3 + length])
            del self._rest[: 3 + length]
            if kind == Kind.HANGUP:
                self.hangup_received = True
                self.call.result.log(self.call.clock(), "bridge", "hangup frame: AudioSocket() returns")
                self.carrier.end_call(self.call.call_id)
                return
            if kind not in AUDIO_KINDS:
                self.warn(f"kind 0x{kind:02x} from the bridge: Asterisk ends the session")
                continue
            if not payload:
                self.warn("empty audio frame: Asterisk ends the session (invalid message length)")
                continue
            if kind != self.kind or length % 2:
                self.warn(f"audio kind 0x{kind:02x}, {length} bytes, in a 0x{self.kind:02x} stream")
            self._note_ahead()
            self.enqueue_audio(payload)

    def _note_ahead(self) -> None:
        """How far ahead of real time this frame arrives: what is still waiting to be played before it, but for
        what this simulator's own late tick owes (``overdue_ms``)."""
        ahead_ms = len(self.queue) * 1000 / (self.rate_hz * 2) - self.overdue_ms(time.monotonic())
        self.max_ahead_ms = max(self.max_ahead_ms, ahead_ms)
        calls = self.carrier.max_ahead_ms
        calls[self.call.call_id] = max(calls.get(self.call.call_id, 0.0), ahead_ms)
        if ahead_ms > MAX_AHEAD_MS and not self._ahead_warned:
            self._ahead_warned = True
            self.warn(f"audio arrived {ahead_ms:.0f} ms ahead of real time: Asterisk would overlap it")


class SimulatedAudioSocket(SimulatedCarrier):
    """Asterisk sending calls to the bridge's AudioSocket listener (see the module docstring)."""

    provider: ClassVar[str] = "audiosocket"
    can_reconnect: ClassVar[bool] = True
    says_goodbye: ClassVar[bool] = False
    uses_marks: ClassVar[bool] = False

    def __init__(self, bridge_url: str, secret: str, *, kind: int = 0x10, dialplan_attempts: int = 3) -> None:
        super().__init__(bridge_url, secret)
        self.kind = kind
        self.dialplan_attempts = dialplan_attempts
        self.host = "127.0.0.1"
        self.port = 0
        self.max_ahead_ms: dict[str, float] = {}
        """Per call: how far ahead of real time the bridge's audio ever arrived (ms)."""
        self.attempts: dict[str, int] = {}
        """Per call: how many times the dialplan has run ``AudioSocket()``."""

    def reconnect_after_every_drop(self) -> None:
        self.dialplan_attempts = 1_000_000  # a dialplan that loops back into AudioSocket() for every drop

    @classmethod
    def bridge_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        return {"audiosocket": {"enabled": True, "host": "127.0.0.1", "port": free_port(), "allowed_sources": ["127.0.0.1/32", "::1/128"]}}

    def configure(self, settings: Settings) -> None:
        self.host, self.port = settings.audiosocket.host, settings.audiosocket.port

    def new_call_id(self) -> str:
        return str(uuid.uuid4())  # what ${UUID()} gives the dialplan; AudioSocket() accepts nothing else

    async def open_stream(self, call: SimCall, reason: OpenReason) -> AudioSocketStream | None:
        result = call.result
        if reason != "answer":
            result.log(call.clock(), "asterisk", f"AudioSocket() returned ({reason}): the dialplan loops back")
        while True:
            attempt = self.attempts.get(call.call_id, 0)
            if attempt >= self.dialplan_attempts:
                result.log(call.clock(), "asterisk", f"{attempt} AudioSocket() runs: the dialplan hangs up")
                return None
            self.attempts[call.call_id] = attempt + 1
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 2.0)  # Asterisk: 2 s
            except (OSError, TimeoutError) as exc:
                result.log(call.clock(), "asterisk", f"AudioSocket() could not connect: {exc!r}")
                continue
            stream = AudioSocketStream(TcpConnection(reader, writer), f"{call.call_id}#{attempt + 1}", call, self, self.kind)
            await stream.send(frame(Kind.UUID, uuid.UUID(call.call_id).bytes))
            await stream.send(frame(self.kind, bytes(stream.frame_bytes)))  # the channel's first 20 ms
            if self.on_media_sent is not None:  # caller audio too (silence), before the script's first frame
                self.on_media_sent(bytes(320))
            return stream

    def unknown_event(self, stream: SimStream) -> bytes:
        return frame(0x20, b"\x01\x02\x03\x04")  # a kind Asterisk might add, control-sized

    def bad_inputs(self, stream: SimStream) -> dict[str, tuple[str | bytes, str]]:
        assert isinstance(stream, AudioSocketStream)
        other_kind = 0x12 if stream.kind != 0x12 else 0x10
        twelve_seconds = frame(stream.kind, bytes(stream.frame_bytes)) * 600
        return {
            "unknown_kind_too_long": (b"\x42\xff\xff", "unknown_event"),
            "garbage": (b"GET / HTTP/1.1\r\nHost: bridge\r\n\r\n", "unknown_event"),
            "second_uuid": (frame(Kind.UUID, uuid.uuid4().bytes), "out_of_order"),
            "audio_kind_change": (frame(other_kind, bytes(AUDIO_KINDS[other_kind] // 50 * 2)), "unsupported_format"),
            "odd_length_pcm": (frame(stream.kind, bytes(stream.frame_bytes + 1)), "bad_field"),
            "bad_dtmf_digit": (frame(Kind.DTMF, b"x"), "bad_field"),
            "long_dtmf": (frame(Kind.DTMF, b"12"), "bad_field"),
            "oversized_error_frame": (b"\xff\x10\x00" + bytes(4096), "oversized"),
            "audio_flood": (twelve_seconds, "flood"),
        }

    async def forged_requests_refused(self) -> bool:
        """A connection from outside ``allowed_sources`` (127.0.0.2) must be closed unanswered, before any call."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.bind(("127.0.0.2", 0))
            await asyncio.get_running_loop().sock_connect(sock, (self.host, self.port))
        except OSError:
            sock.close()
            return True  # not even connected
        reader, writer = await asyncio.open_connection(sock=sock)
        call_id = uuid.uuid4()
        try:
            writer.write(frame(Kind.UUID, call_id.bytes) + frame(self.kind, bytes(AUDIO_KINDS[self.kind] // 50 * 2)) * 10)
            with contextlib.suppress(OSError):
                await writer.drain()
            try:
                received = await asyncio.wait_for(reader.read(65536), 2.0)
            except TimeoutError:
                return False  # still open: admitted
            except OSError:
                received = b""
            return received == b""
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
