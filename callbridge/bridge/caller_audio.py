"""The caller's side of one stream, sans-I/O (``CallSession`` composes it): the flood limit over the carrier's
messages (``MessageBucket``), the caller's audio decoded, gap-filled and resampled (``InboundAudio``), where it falls
on the call's input timeline (the engine's, continued across a resumed call's streams), and the recording of it."""

from __future__ import annotations

from callbridge.bridge.agent_audio import AgentAudio
from callbridge.bridge.call_outputs import CallerAudioBegan, CallOutput, ClockDistrusted, RecordingChunk
from callbridge.bridge.inbound import InboundAudio, MessageBucket
from callbridge.bridge.recording import StereoRecorder
from callbridge.codecs import PCM16_SAMPLE_BYTES, ResamplerQuality

__all__ = ["CallerAudio"]


class CallerAudio:
    """The caller's audio of one stream, and the call's input timeline. See the module docstring."""

    __slots__ = ("inbound", "_bucket", "recorder", "input_ms", "call_offset_ms", "_out")

    def __init__(self, engine_rate_hz: int, quality: ResamplerQuality, out: list[CallOutput]) -> None:
        self.inbound = InboundAudio(engine_rate_hz, quality)
        """The caller's audio: decoded, gaps filled, resampled, held until the engine is bound (``bridge/inbound.py``)."""
        self._bucket = MessageBucket()
        """The flood limit over the carrier's messages."""
        self.recorder: StereoRecorder | None = None
        """The stream's recording, where the call is recorded: the driver takes its last chunk as the stream ends."""
        self.input_ms = 0
        """ms of caller audio handed to the engine over the whole call (the engine's input timeline)."""
        self.call_offset_ms = 0
        """Where this stream's media time 0 falls on the call's input timeline (set by ``bound``)."""
        self._out = out

    def admits(self, now_ms: int, *, started: bool) -> bool:
        """The flood limit: one message read at ``now_ms`` (False: more than a media stream sends)."""
        return self._bucket.take(now_ms, started=started)

    def receive(self, payload: bytes, timestamp_ms: int | None, now_ms: int) -> bytes:
        """One media payload: the caller's audio at the engine's rate (gaps before it filled), recorded where the call
        is. Raises ``MediaAhead`` for media that runs ahead of real time."""
        inbound = self.inbound
        if inbound.first_media_at_ms is None:
            self._out.append(CallerAudioBegan())
        trusted = inbound.timestamps_distrusted is None
        audio = inbound.receive(payload, timestamp_ms, now_ms)
        if trusted and inbound.timestamps_distrusted is not None:
            self._out.append(ClockDistrusted(inbound.timestamps_distrusted))
        self.input_ms += inbound.payload_ms
        recorder = self.recorder
        if recorder is not None:
            recorder.caller(inbound.pcm)
            chunk = recorder.take(now_ms)
            if chunk is not None:
                self._out.append(RecordingChunk(chunk))
        return audio

    @property
    def media_until_ms(self) -> int | None:
        """When the end of the caller's audio received so far was said, on the driver's clock (what a burst read late
        says of its own time: ``InboundAudio.media_until_ms``). None: no media came."""
        return self.inbound.media_until_ms

    def said_until_ms(self, now_ms: int) -> int:
        """``media_until_ms``, or ``now_ms`` before any media came."""
        until = self.media_until_ms
        return now_ms if until is None else until

    def bound(self, call_offset_ms: int | None) -> None:
        """The engine session is bound; a resumed call's stream starts at ``call_offset_ms`` of its input timeline."""
        if call_offset_ms is not None:
            self.input_ms += call_offset_ms - self.call_offset_ms
            self.call_offset_ms = call_offset_ms

    def record_from(self, now_ms: int, agent: AgentAudio) -> StereoRecorder:
        """Record the stream from the caller's first audio kept (it came in real time, up to now)."""
        held_pcm, rate_hz = self.inbound.held_pcm(), self.inbound.rate_hz
        held = sum(map(len, held_pcm)) // PCM16_SAMPLE_BYTES
        self.recorder = StereoRecorder(
            rate_hz=rate_hz, agent_rate_hz=agent.rate_hz, agent_encoding=agent.encoding, started_ms=now_ms - held * 1000 // rate_hz
        )
        for pcm in held_pcm:
            self.recorder.caller(pcm)
        return self.recorder
