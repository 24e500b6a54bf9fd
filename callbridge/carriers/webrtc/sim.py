"""A browser's side of a ``/talk`` call, for tests and benches: an aiortc peer that posts its offer the way the page
does (``talk.html``), plays PCM as its microphone and keeps what it hears, frame by frame, with when it heard it.

It is the page's protocol, not the page: the real-browser test drives Chromium on the page itself."""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import httpx
import numpy as np
import orjson
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame, AudioResampler

from callbridge.carriers.webrtc import jitter
from callbridge.codecs import ResamplerQuality, StreamResampler

__all__ = ["BrowserCall", "Heard", "MicrophoneTrack"]

_RATE_HZ: Final = 48_000
_SAMPLES: Final = _RATE_HZ // 50


class MicrophoneTrack(MediaStreamTrack):
    """PCM16 mono 8 kHz played as a microphone (48 kHz, 20 ms frames, in real time), then silence; ``spoke_at``: when
    its first frame went out (``time.monotonic()``)."""

    kind = "audio"

    def __init__(self, pcm_8k: bytes) -> None:
        super().__init__()
        resampler = StreamResampler(8000, _RATE_HZ, ResamplerQuality.HQ)
        self.pcm = resampler.process(pcm_8k) + resampler.flush()
        self.spoke_at: float | None = None
        self.done_at: float | None = None
        self._at = 0
        self._start: float | None = None

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = self.spoke_at = now
        else:
            due = self._start + self._at / (_RATE_HZ * 2)
            if due > now:
                await asyncio.sleep(due - now)
        chunk = self.pcm[self._at : self._at + _SAMPLES * 2]
        if len(chunk) < _SAMPLES * 2 and self.done_at is None:
            self.done_at = time.monotonic()
        frame = AudioFrame(format="s16", layout="mono", samples=_SAMPLES)
        frame.planes[0].update(chunk.ljust(_SAMPLES * 2, b"\0"))
        frame.pts = self._at // 2
        frame.sample_rate = _RATE_HZ
        frame.time_base = fractions.Fraction(1, _RATE_HZ)
        self._at += _SAMPLES * 2
        return frame


@dataclass(slots=True)
class Heard:
    """What the browser heard: each 20 ms frame's RMS, and when it arrived (``time.monotonic()``)."""

    rms: list[float] = field(default_factory=list)
    at: list[float] = field(default_factory=list)

    def loud_ms(self, floor: float = 300.0) -> int:
        return 20 * sum(1 for rms in self.rms if rms > floor)

    def first_loud_at(self, floor: float = 300.0, after: float = 0.0) -> float | None:
        return next((at for rms, at in zip(self.rms, self.at, strict=True) if rms > floor and at >= after), None)


class BrowserCall:
    """One call from a browser to ``base_url``'s ``/talk`` (see the module docstring)."""

    def __init__(
        self, base_url: str, pcm_8k: bytes, *, token: str | None = None, parameters: Mapping[str, str] | None = None,
        jitter_frames: int | None = None,
    ) -> None:
        """``jitter_frames``: the frames its receiver holds (as ``webrtc.jitter_frames`` does the bridge's); None:
        aiortc's own, 4."""
        self.base_url = base_url
        self.token = token
        self.parameters = dict(parameters or {})
        self.microphone = MicrophoneTrack(pcm_8k)
        self.heard = Heard()
        self.call_id: str | None = None
        self.jitter_frames = jitter_frames
        self.connection = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.connection.createDataChannel("control")
        self.hung_up_by_agent = asyncio.Event()
        self.transcript: list[dict[str, str | None]] = []
        """The transcript messages the page would show (``{"type": "transcript", "who", "id", "text"}``)."""
        self._listening: asyncio.Task[None] | None = None
        self._mono = AudioResampler(format="s16", layout="mono", rate=_RATE_HZ)
        self.channel.on("message", self._message)
        self.connection.on("track", self._track)

    def _message(self, message: str | bytes) -> None:
        if message == "bye":
            self.hung_up_by_agent.set()
        elif isinstance(message, str) and message.startswith("{"):
            self.transcript.append(orjson.loads(message))

    def _track(self, track: MediaStreamTrack) -> None:
        self._listening = asyncio.create_task(self._listen(track))

    async def _listen(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                assert isinstance(frame, AudioFrame)
                for mono in self._mono.resample(frame):
                    samples = mono.to_ndarray().reshape(-1).astype(np.float64)
                    self.heard.rms.append(float(np.sqrt((samples**2).mean())) if samples.size else 0.0)
                    self.heard.at.append(time.monotonic())
        except MediaStreamError:
            return

    async def offer(self) -> httpx.Response:
        """The offer posted (the answer applied when it is one); the bridge's response."""
        self.connection.addTrack(self.microphone)
        await self.connection.setLocalDescription(await self.connection.createOffer())
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        body = {"type": "offer", "sdp": self.connection.localDescription.sdp, "parameters": self.parameters}
        async with httpx.AsyncClient(base_url=self.base_url, timeout=10) as client:
            response = await client.post("/talk/offer", json=body, headers=headers)
        if response.status_code == 200:
            answer = response.json()
            self.call_id = answer["call_id"]
            await self.connection.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type="answer"))
            if self.jitter_frames is not None:
                jitter.install(self.connection, self.jitter_frames)
        return response

    def send(self, message: str) -> None:
        """A control message on the data channel (``bye``, ``dtmf:5``), as the page sends it."""
        self.channel.send(message)

    async def hang_up(self) -> None:
        if self.channel.readyState == "open":
            self.channel.send("bye")
            await asyncio.sleep(0.05)
        await self.close()

    async def close(self) -> None:
        await self.connection.close()
        if self._listening is not None:
            self._listening.cancel()
