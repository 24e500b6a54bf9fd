"""One browser call's peer connection (aiortc) as a ``CarrierTransport``: the caller's decoded audio in, the agent's
PCM out on a track that keeps its own 20 ms clock.

aiortc does ICE (host candidates), DTLS-SRTP and Opus; what is ours is the two tracks' edge and the call's life:

- In: the browser's track is read as it is decoded (48 kHz, mostly stereo), downmixed to mono PCM16 and cut into
  20 ms frames (``wire.FRAME_BYTES``). The transport's first message is ``start`` once the connection is up; the
  call ends (``bye``) when the connection fails or closes, the browser's track ends, the page says ``bye`` on its data
  channel, no connection comes within ``webrtc.connect_timeout_s`` of the answer, or no audio for
  ``webrtc.idle_timeout_s`` (``timed_out`` says which).
- Out: ``AgentTrack`` is what aiortc's sender reads: a frame every 20 ms on its own grid, the agent's next frame where
  the bridge has given one, else silence. While silence goes out, the agent's first frame goes the moment it comes
  (the grid starts again from it) rather than at the next tick. The bridge paces its frames a lead ahead (``wire.PROFILE``); what the track
  holds past ``_MAX_HELD_FRAMES`` (a pacer gone wrong) is dropped, oldest first, and counted, so the browser is never
  far behind the heard position the bridge reckons.
- Closing sends ``bye`` on the data channel (the page shows the call ended) and closes the peer connection.
"""

from __future__ import annotations

import asyncio
import fractions
from collections import deque
from contextlib import suppress
from typing import Final, Literal

import orjson
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame, AudioResampler

from callbridge.bridge.carrier_transport import receive_within
from callbridge.carriers.webrtc import jitter
from callbridge.carriers.webrtc.settings import WebRtcSettings
from callbridge.carriers.webrtc.wire import FRAME_BYTES, KEYS, PROVIDER, RATE_HZ
from callbridge.codecs import AudioEncoding, FrameAssembler
from callbridge.logging import get_logger

__all__ = ["AgentTrack", "BadOffer", "PeerTransport", "answer_offer"]

log = get_logger(__name__)

_FRAME_S: Final = 0.020
_SAMPLES: Final = RATE_HZ // 50
_TIME_BASE: Final = fractions.Fraction(1, RATE_HZ)
_MAX_HELD_FRAMES: Final = 10
"""200 ms: five times the bridge's lead. More means the pacer and this clock disagree; the oldest is dropped."""
_MAX_QUEUED: Final = 100
"""Caller frames waiting for the call core (2 s): past it the browser's audio is dropped and counted."""
_MAX_TRANSCRIPT_CHARS: Final = 4096
_MAX_UNSENT: Final = 32

TimedOut = Literal["no_connection", "idle"]


class AgentTrack(MediaStreamTrack):
    """The agent's audio to the browser: one 20 ms frame per tick of its own clock (see the module docstring)."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.held: deque[bytes] = deque()
        self.dropped = 0
        """Frames dropped because more than ``_MAX_HELD_FRAMES`` were held."""
        self._silence = bytes(FRAME_BYTES)
        self._pts = 0
        self._start_s: float | None = None
        self._silent = True
        """The last frame out was silence (nothing was held)."""
        self._arrived = asyncio.Event()

    def play(self, pcm: bytes) -> None:
        """Queue the agent's audio (whole 20 ms frames, as the bridge sends them; a short one is padded)."""
        for at in range(0, len(pcm), FRAME_BYTES):
            self.held.append(pcm[at : at + FRAME_BYTES].ljust(FRAME_BYTES, b"\0"))
        while len(self.held) > _MAX_HELD_FRAMES:
            self.held.popleft()
            self.dropped += 1
        self._arrived.set()

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._start_s is None:
            self._start_s = loop.time()
        else:
            self._pts += _SAMPLES
            due = self._start_s + self._pts / RATE_HZ
            if (wait := due - loop.time()) > 0:
                if self.held or not self._silent:
                    await asyncio.sleep(wait)
                else:  # silence is going out: the agent's first frame goes when it comes, not at the next tick
                    self._arrived.clear()
                    with suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await self._arrived.wait()
                    if self.held:
                        self._start_s = loop.time() - self._pts / RATE_HZ  # the grid from now
            elif wait < -10 * _FRAME_S:  # the loop stalled: a new grid from now, rather than a burst to catch up
                self._start_s = loop.time() - self._pts / RATE_HZ
        self._silent = not self.held
        frame = AudioFrame(format="s16", layout="mono", samples=_SAMPLES)
        frame.planes[0].update(self.held.popleft() if self.held else self._silence)
        frame.pts = self._pts
        frame.sample_rate = RATE_HZ
        frame.time_base = _TIME_BASE
        return frame


class PeerTransport:
    """A browser call's peer connection as the call core reads and writes it (see the module docstring)."""

    def __init__(self, call_id: str, connection: RTCPeerConnection, *, connect_timeout_s: float, idle_timeout_s: float) -> None:
        self.call_id = call_id
        self.connection = connection
        self.agent = AgentTrack()
        self.queue: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self.closed = False
        self.connected = False
        self.timed_out: TimedOut | None = None
        self.overflow = 0
        """Caller frames dropped because the call core fell ``_MAX_QUEUED`` behind."""
        self.control_dropped = 0
        self._connect_timeout_s = connect_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._channel: RTCDataChannel | None = None
        self._unsent: list[str] = []
        """Transcript messages from before the page's data channel opened (at most ``_MAX_UNSENT``)."""
        self._reader: asyncio.Task[None] | None = None
        self._frames = FrameAssembler(RATE_HZ, AudioEncoding.L16)
        self._mono = AudioResampler(format="s16", layout="mono", rate=RATE_HZ)
        connection.on("track", self._track)
        connection.on("datachannel", self._data_channel)
        connection.on("connectionstatechange", self._state_changed)

    # the peer connection's events
    def _track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self._reader is None:
            self._reader = asyncio.create_task(self._read(track))

    def _data_channel(self, channel: RTCDataChannel) -> None:
        self._channel = channel
        channel.on("open", self._send_unsent)
        if channel.readyState == "open":
            self._send_unsent()

        @channel.on("message")
        def _message(message: str | bytes) -> None:
            if message == "bye" or (isinstance(message, str) and len(message) == 6 and message[:5] == "dtmf:" and message[5] in KEYS):
                self._signal(message)
            else:  # the page sends nothing else: whatever it is, the call goes on without it
                self.control_dropped += 1

    async def _state_changed(self) -> None:
        state = self.connection.connectionState
        if state == "connected" and not self.connected:
            self.connected = True
            self._signal("start")
        elif state in ("failed", "closed"):
            if self.connected:
                self._signal("bye")
            elif not self.closed:
                self.queue.put_nowait(None)  # never connected: no call to end, the stream is over

    async def _read(self, track: MediaStreamTrack) -> None:
        try:
            while not self.closed:
                frame = await track.recv()
                assert isinstance(frame, AudioFrame)
                for mono in self._mono.resample(frame):
                    for pcm in self._frames.push(_pcm(mono)):
                        if self.queue.qsize() >= _MAX_QUEUED:
                            self.overflow += 1
                        else:
                            self.queue.put_nowait(pcm)
        except MediaStreamError:
            self._signal("bye")

    def _signal(self, message: str) -> None:
        if not self.closed:
            self.queue.put_nowait(message)

    # CarrierTransport
    async def receive(self) -> str | bytes | None:
        """The next frame of the caller's audio or control message; ``bye`` when the browser is gone (see the module
        docstring); None once closed."""
        while not (self.closed and self.queue.empty()):
            timeout_s = self._idle_timeout_s if self.connected else self._connect_timeout_s
            try:
                return await receive_within(self.queue.get, timeout_s)
            except TimeoutError:
                self.timed_out = "idle" if self.connected else "no_connection"
                log.warning("webrtc_timeout", provider=PROVIDER, call_id=self.call_id, waited_for=self.timed_out, waited_s=timeout_s)
                return "bye" if self.connected else None
        return None

    def transcript(self, who: Literal["agent", "caller"], text: str, item_id: str | None) -> None:
        """To the page, on the data channel: ``{"type": "transcript", "who", "id", "text"}`` (the agent's as deltas of
        its reply ``id``, the caller's a line at a time)."""
        if self.closed or not text:
            return
        message = orjson.dumps({"type": "transcript", "who": who, "id": item_id, "text": text[:_MAX_TRANSCRIPT_CHARS]}).decode()
        channel = self._channel
        if channel is None or channel.readyState != "open":  # the greeting's, said before the channel is up: kept
            if len(self._unsent) < _MAX_UNSENT:
                self._unsent.append(message)
            return
        with suppress(Exception):  # the page's screen only: the call goes on without it
            channel.send(message)

    def _send_unsent(self) -> None:
        channel, self._unsent, unsent = self._channel, [], self._unsent
        if channel is not None and not self.closed:
            for message in unsent:
                with suppress(Exception):
                    channel.send(message)

    async def send(self, message: str | bytes) -> None:
        if self.closed:
            raise ConnectionError("the browser's peer connection is closed")
        if isinstance(message, str):
            raise TypeError("the browser's track carries audio only")
        self.agent.play(message)

    async def close(self, code: int = 1000) -> None:
        if self.closed:
            return
        self.closed = True
        channel = self._channel
        if channel is not None and channel.readyState == "open":
            with suppress(Exception):
                channel.send("bye")
        self.agent.stop()
        if self._reader is not None:
            self._reader.cancel()
        with suppress(Exception):
            async with asyncio.timeout(2.0):
                await self.connection.close()
        self.queue.put_nowait(None)


def _pcm(frame: AudioFrame) -> bytes:
    """A packed mono s16 frame's samples (native order: little-endian on every platform PyAV ships for), one copy of
    its plane (which may be padded past them)."""
    return bytes(frame.planes[0])[: frame.samples * 2]


class BadOffer(Exception):
    """An offer aiortc could not answer (not SDP, no audio, no Opus): its connection is closed."""


async def answer_offer(call_id: str, offer_sdp: str, settings: WebRtcSettings) -> tuple[PeerTransport, str]:
    """A peer connection that answers the browser's offer with Opus only, our jitter buffer on its audio (``jitter.py``)
    and the agent's track; the call's transport and the answer's SDP. Raises ``BadOffer``."""
    connection = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    transport = PeerTransport(call_id, connection, connect_timeout_s=settings.connect_timeout_s, idle_timeout_s=settings.idle_timeout_s)
    try:
        await connection.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        if not jitter.install(connection, settings.jitter_frames):
            log.warning("webrtc_jitter_buffer_kept", call_id=call_id, detail="aiortc's own (4 frames, stalls on a loss): not replaced")
        audio = [t for t in connection.getTransceivers() if t.kind == "audio"]
        if not audio:
            raise ValueError("the offer has no audio")
        opus = [codec for codec in RTCRtpSender.getCapabilities("audio").codecs if codec.mimeType.lower() == "audio/opus"]
        audio[0].setCodecPreferences(opus)
        connection.addTrack(transport.agent)
        await connection.setLocalDescription(await connection.createAnswer())
    except Exception as exc:  # aiortc's parsers raise what they raise: whatever it is, the offer is refused
        with suppress(Exception):
            await connection.close()
        raise BadOffer(f"{type(exc).__name__}: {str(exc)[:200]}") from exc
    return transport, connection.localDescription.sdp
