"""The call's stereo recording (``StereoRecorder``) fed as the call feeds it, on a virtual clock: the caller's
audio on the left as received, the agent's on the right where the playout ledger played it — nothing of what a
barge-in's clear dropped, the frame playing at the clear cut there."""

from __future__ import annotations

import numpy as np
import pytest

from callbridge.bridge.playout import PlayoutLedger
from callbridge.bridge.recording import StereoRecorder
from callbridge.carriers.base import SendMark
from callbridge.codecs.g711 import AudioEncoding, decode_to_pcm16, encode_from_pcm16

pytestmark = pytest.mark.core

RATE = 8000
FRAME_MS = 20
FRAME = RATE * FRAME_MS // 1000


def tone(ms: int, hz: float, rate: int = RATE, amplitude: int = 8000) -> np.ndarray:
    t = np.arange(ms * rate // 1000) / rate
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.int16)


class Call:
    """A stream's recording fed on a clock: caller frames every 20 ms, agent frames through a real ledger."""

    def __init__(self, *, agent_rate: int = RATE, agent_encoding: AudioEncoding = AudioEncoding.PCMU) -> None:
        self.now = 1_000
        self.ledger = PlayoutLedger(frame_ms=FRAME_MS, lead_ms=200)
        self.recorder = self.ledger.recorder = StereoRecorder(
            rate_hz=RATE, agent_rate_hz=agent_rate, agent_encoding=agent_encoding, started_ms=self.now
        )
        self.agent_rate, self.agent_encoding = agent_rate, agent_encoding
        self.chunks: list[bytes] = []
        self.caller_sent = np.zeros(0, dtype=np.int16)

    def say(self, pcm: np.ndarray) -> None:
        """The agent's reply, all queued at once (the engine runs ahead of real time)."""
        frame = self.agent_rate * FRAME_MS // 1000
        for i in range(0, len(pcm), frame):
            self.ledger.enqueue("resp-1", [encode_from_pcm16(self.agent_encoding, pcm[i : i + frame].tobytes())], self.now)

    def run(self, ms: int, caller: np.ndarray | None = None) -> None:
        """``ms`` of the call: a caller frame (silence unless given) every 20 ms, the ledger ticking."""
        for i in range(ms // FRAME_MS):
            self.now += FRAME_MS
            frame = caller[i * FRAME : (i + 1) * FRAME] if caller is not None else np.zeros(FRAME, dtype=np.int16)
            # μ-law as the carrier sends it: what the caller channel must hold is the decoded frame
            received = np.frombuffer(decode_to_pcm16(AudioEncoding.PCMU, encode_from_pcm16(AudioEncoding.PCMU, frame.tobytes())), np.int16)
            self.caller_sent = np.concatenate([self.caller_sent, received])
            self.recorder.caller(received.tobytes())
            self.ledger.tick(self.now)
            chunk = self.recorder.take(self.now)
            if chunk is not None:
                self.chunks.append(chunk)

    def end(self) -> np.ndarray:
        chunk = self.recorder.take(self.now, final=True)
        if chunk is not None:
            self.chunks.append(chunk)
        return np.frombuffer(b"".join(self.chunks), dtype=np.int16).reshape(-1, 2)


def pcmu_frames(pcm: np.ndarray) -> list[bytes]:
    """``pcm`` as the ledger sends it: 20 ms μ-law frames."""
    return [encode_from_pcm16(AudioEncoding.PCMU, pcm[i : i + FRAME].tobytes()) for i in range(0, len(pcm), FRAME)]


def ms(at_ms: int) -> int:
    return at_ms * RATE // 1000


def test_left_is_the_caller_as_received_and_right_the_agent_where_it_played() -> None:
    call = Call()
    call.run(500)
    reply = tone(1000, 440)
    call.say(reply)  # queued at 500 ms: plays from 500 to 1500 ms
    call.run(2000, caller=tone(2000, 300))
    stereo = call.end()
    assert len(stereo) == ms(2500)
    assert np.array_equal(stereo[:, 0], call.caller_sent)
    heard = stereo[:, 1]
    assert not heard[: ms(500)].any() and not heard[ms(1500) :].any()
    played = np.frombuffer(decode_to_pcm16(AudioEncoding.PCMU, encode_from_pcm16(AudioEncoding.PCMU, reply.tobytes())), np.int16)
    assert np.array_equal(heard[ms(500) : ms(1500)], played)


def test_written_as_it_goes_so_a_crash_loses_at_most_a_second() -> None:
    call = Call()
    for _ in range(250):  # 5 s
        call.run(20)
        assert call.recorder.duration_ms >= call.now - call.recorder.started_ms - 1000
    assert len(call.chunks) == 9 and {len(chunk) for chunk in call.chunks} == {ms(500) * 4}
    assert len(call.end()) == ms(5000)


def test_a_run_goes_where_the_markers_echoes_say_it_played() -> None:
    """The carrier plays the reply 15 ms later than it was sent (its own 20 ms clock): the first marker's echo
    says so, and the whole run moves there, back to back."""
    call = Call()
    call.run(400)
    reply = tone(1000, 440)
    call.say(reply)  # sent at 400 ms
    call.run(100)
    first_mark = next(action.name for action in call.ledger.actions_to_send() if isinstance(action, SendMark))
    call.now += 15
    call.ledger.mark_echoed(first_mark, call.now)  # 100 ms of it played by 515 ms: it began at 415
    call.run(1500)
    heard = call.end()[:, 1]
    assert not heard[: ms(415)].any()
    played = np.frombuffer(decode_to_pcm16(AudioEncoding.PCMU, encode_from_pcm16(AudioEncoding.PCMU, reply.tobytes())), np.int16)
    assert np.array_equal(heard[ms(415) : ms(1415)], played)


def test_an_early_echo_never_moves_a_run_over_the_one_before() -> None:
    """The model saw an underrun (a second run 10 ms after the first ended: the bridge was late), then an echo
    30 ms early moved it back: the carrier played the two back to back, so the second starts where the first ended
    — not over its last 20 ms (seen on a loaded machine as 1 ms of the greeting missing from the recording)."""
    recorder = StereoRecorder(rate_hz=RATE, agent_rate_hz=RATE, agent_encoding=AudioEncoding.PCMU, started_ms=0)
    first, second = pcmu_frames(tone(200, 440)), pcmu_frames(tone(200, 300))
    for i, frame in enumerate(first):
        recorder.agent(i * FRAME_MS, frame, sent_ms=0)
    recorder.caller(bytes(ms(100) * 2))
    written = recorder.take(600)  # the first run's first 100 ms
    assert written is not None and len(written) == ms(100) * 4
    for i, frame in enumerate(second):
        recorder.agent(210 + i * FRAME_MS, frame, sent_ms=190)
    recorder.echoed(-30, 600)
    recorder.caller(bytes(ms(500) * 2))
    written += recorder.take(600, final=True) or b""
    channel = np.frombuffer(written, np.int16)[1::2]
    played = np.frombuffer(decode_to_pcm16(AudioEncoding.PCMU, b"".join(first + second)), np.int16)
    assert len(channel) == ms(600) and np.array_equal(channel[: ms(400)], played) and not channel[ms(400) :].any()


def test_a_late_echo_after_the_run_is_written_leaves_it_whole() -> None:
    """An echo 6 ms late once part of the run is written: the run stays as written, and its next frames — which
    the ledger now times 6 ms later — follow it back to back, not after a 6 ms gap (seen on a loaded machine)."""
    recorder = StereoRecorder(rate_hz=RATE, agent_rate_hz=RATE, agent_encoding=AudioEncoding.PCMU, started_ms=0)
    frames = pcmu_frames(tone(1200, 440))
    for i, frame in enumerate(frames[:40]):  # sent a lead (200 ms) ahead
        recorder.agent(i * FRAME_MS, frame, sent_ms=max(0, i * FRAME_MS - 200))
    recorder.caller(bytes(ms(100) * 2))
    written = recorder.take(600) or b""
    recorder.echoed(6, 600)
    for i, frame in enumerate(frames[40:], start=40):
        recorder.agent(i * FRAME_MS + 6, frame, sent_ms=i * FRAME_MS - 200)
    recorder.caller(bytes(ms(1300) * 2))
    written += recorder.take(1400, final=True) or b""
    channel = np.frombuffer(written, np.int16)[1::2]
    played = np.frombuffer(decode_to_pcm16(AudioEncoding.PCMU, b"".join(frames)), np.int16)
    assert len(channel) == ms(1400) and np.array_equal(channel[: ms(1200)], played) and not channel[ms(1200) :].any()


def test_what_the_clear_dropped_is_never_in_it_and_the_frame_playing_is_cut_there() -> None:
    call = Call()
    call.say(tone(3000, 440))
    call.run(1000)
    call.now += 10  # the caller cuts in at 1010 ms (half a frame into the 51st)
    flushed = call.ledger.flush(call.now)
    assert flushed.heard_ms == 1010
    call.run(980)
    heard = call.end()[:, 1]
    assert np.abs(heard[ms(20) : ms(990)]).max() > 4000  # the reply until the clear…
    assert heard[ms(1000) : ms(1010)].any() and not heard[ms(1010) :].any()  # …and nothing of it after


def test_an_agent_at_another_rate_is_resampled_in_place() -> None:
    call = Call(agent_rate=16000, agent_encoding=AudioEncoding.L16)
    call.run(200)
    call.say(tone(1000, 500, rate=16000))
    call.run(1800)
    heard = call.end()[:, 1].astype(np.float64)
    expected = np.zeros(ms(2000))
    expected[ms(200) : ms(1200)] = tone(1000, 500)
    inner = slice(ms(250), ms(1150))  # away from the edges, where the resampler's filter rings
    correlation = np.corrcoef(heard[inner], expected[inner])[0, 1]
    assert correlation > 0.99, correlation
    assert np.abs(heard[ms(1300) :]).max() < 100


def test_a_caller_backlog_is_written_as_it_comes_and_silence_pads_the_end() -> None:
    call = Call()
    recorder = call.recorder
    recorder.caller(tone(8000, 300).tobytes())  # 8 s read at once (a stall's backlog)
    chunk = recorder.take(call.now + 1000)
    assert chunk is not None and len(chunk) == ms(8000) * 4  # further ahead than it waits for: written
    call.chunks.append(chunk)
    call.now += 9000
    stereo = call.end()
    assert len(stereo) == ms(9000) and not stereo[ms(8000) :, 0].any()
