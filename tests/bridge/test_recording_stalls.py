"""The recording against a carrier that plays in real time while the bridge stalls (a GC pause, a starved VM): a
seeded simulation on a virtual clock, millisecond by millisecond — the ledger and the recorder as the call drives
them, a carrier that plays its buffer on its own 20 ms clock and echoes each marker once the audio before it has
played, the network's delay each way, and stalls of the bridge in which it reads, sends and writes nothing.

The invariant: each run of agent audio the caller heard is in the recording sample for sample, back to back, where
the caller heard it — later by exactly the echo's way back (``back_ms``, which the first echo counts as the carrier's
delay and nothing can tell apart) — and nothing else is in it. A barge-in cuts the recording where the bridge
flushed, on the recording's clock: what the caller heard in the ``out_ms + back_ms`` before the clear reached the
carrier is not in it."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pytest

from callbridge.bridge.playout import PlayoutLedger
from callbridge.bridge.recording import StereoRecorder
from callbridge.carriers.base import SendClear, SendMark, SendMedia
from callbridge.codecs.g711 import AudioEncoding, decode_to_pcm16, encode_from_pcm16

pytestmark = pytest.mark.core

FRAME_MS = 20
FRAME = 160
"""A frame at 8 kHz, μ-law: samples and bytes."""
MARK_EVERY_MS = 100
"""The ledger's markers (its defaults): one every 5 frames of a response, so in each 100 ms of a run."""
START_MS = 1_000
CALL_MS = 4_000


@dataclass
class RealTimeCarrier:
    """Plays what it holds on its own 20 ms clock (``phase``), silence when it holds nothing; echoes a marker once
    the audio before it has played (at once where nothing is queued before it); a clear stops the frame playing
    where it is and drops the rest, echoing the markers pending (as Twilio does)."""

    phase: int
    queued: deque[bytes | str] = field(default_factory=deque)
    heard: list[tuple[int, np.ndarray]] = field(default_factory=list)
    """(when it started playing, the frame as PCM16) — cut short at a clear."""
    echoes: list[tuple[int, str]] = field(default_factory=list)
    playing: bool = False

    def receive(self, now: int, action: SendMedia | SendMark | SendClear) -> None:
        if isinstance(action, SendMedia):
            self.queued.extend(action.payload[i : i + FRAME] for i in range(0, len(action.payload), FRAME))
        elif isinstance(action, SendMark):
            self.queued.append(action.name)
            if not self.playing:
                self._echo_leading(now)
        else:
            if self.playing:
                at, pcm = self.heard[-1]
                self.heard[-1] = (at, pcm[: (now - at) * 8])
                self.playing = False
            self.echoes += [(now, name) for name in self.queued if isinstance(name, str)]
            self.queued.clear()

    def tick(self, now: int) -> None:
        if (now - self.phase) % FRAME_MS:
            return
        if self.playing:
            self.playing = False
            self._echo_leading(now)
        if self.queued and isinstance(self.queued[0], bytes):
            frame = self.queued.popleft()
            assert isinstance(frame, bytes)
            self.heard.append((now, np.frombuffer(decode_to_pcm16(AudioEncoding.PCMU, frame), dtype=np.int16)))
            self.playing = True

    def _echo_leading(self, now: int) -> None:
        while self.queued and isinstance(self.queued[0], str):
            name = self.queued.popleft()
            assert isinstance(name, str)
            self.echoes.append((now, name))


@dataclass(frozen=True)
class Run:
    """A run of the agent's audio the caller heard: where it started (ms from the recording's start), the samples."""

    at_ms: int
    pcm: np.ndarray


@dataclass(frozen=True)
class Outcome:
    heard: list[Run]
    recorded: np.ndarray
    out_ms: int
    back_ms: int
    stalls: list[tuple[int, int]]
    cut_ms: int | None
    """When the bridge flushed (a barge-in), if it did."""

    def assert_as_heard(self) -> None:
        """Each run heard is in the recording sample for sample, ``back_ms`` later; the run a clear cut, up to
        where the bridge cut the recording; nothing else."""
        covered = np.zeros(len(self.recorded), dtype=bool)
        for run in self.heard:
            start = (run.at_ms + self.back_ms) * 8
            pcm = run.pcm
            if self.cut_ms is not None:  # cut where the bridge flushed; the carrier played on until the clear came
                pcm = pcm[: max(0, self.cut_ms - self.back_ms - run.at_ms) * 8]
            assert np.array_equal(self.recorded[start : start + len(pcm)], pcm), (run.at_ms, len(run.pcm) // 8, self.describe())
            covered[start : start + len(pcm)] = True
        stray = np.flatnonzero(~covered & (self.recorded != 0))
        assert not len(stray), (stray[0] / 8, self.describe())

    def assert_every_frame_heard_once_in_order(self, *, within_ms: int) -> None:
        """Each whole frame the caller heard is in the recording once, in the order heard, and within ``within_ms``
        of where it was heard (``back_ms`` later) — but for a run the carrier played out while the bridge stalled
        (every echo of it read late: nothing says when it played); nothing else is in it."""
        recorded, covered, searched_from = self.recorded, np.zeros(len(self.recorded), dtype=bool), 0
        for run in self.heard:
            echoes_from, echoes_to = (run.at_ms + min(MARK_EVERY_MS, len(run.pcm) // 8) + self.back_ms, run.at_ms + len(run.pcm) // 8 + self.back_ms)
            unseen = any(at <= echoes_from and echoes_to < at + ms for at, ms in self.stalls)
            for k in range(0, len(run.pcm) - FRAME + 1, FRAME):
                frame = run.pcm[k : k + FRAME]
                starts = np.flatnonzero(recorded[searched_from : len(recorded) - FRAME + 1] == frame[0]) + searched_from
                at = next((int(i) for i in starts if np.array_equal(recorded[i : i + FRAME], frame)), None)
                assert at is not None, (run.at_ms + k // 8, self.describe())
                off_ms = at / 8 - (run.at_ms + k / 8 + self.back_ms)
                assert unseen or abs(off_ms) <= within_ms, (run.at_ms + k // 8, off_ms, self.describe())
                covered[at : at + FRAME] = True
                searched_from = at + FRAME
        stray = np.flatnonzero(~covered & (recorded != 0))
        assert not len(stray), (stray[0] / 8, self.describe())

    def describe(self) -> str:
        recorded = np.flatnonzero(self.recorded)
        return (
            f"heard {[(run.at_ms, len(run.pcm) // 8) for run in self.heard]}; recorded from {recorded[0] / 8 if len(recorded) else None}"
            f" to {recorded[-1] / 8 if len(recorded) else None}; out {self.out_ms} ms, back {self.back_ms} ms, cut {self.cut_ms};"
            f" stalls {self.stalls}"
        )


def simulate(seed: int, *, stall_ms: tuple[int, ...] = (5, 10, 15, 25, 40, 60), barge_in_ms: int | None = None) -> Outcome:
    """A 1.8 s greeting (noise, so that a run matches in one place only) in a 4 s call; the engine hands the bridge
    its first second at once and the rest later, as the embedded engine does. Seeded: the network's delay each way
    (0–15 ms), the carrier's clock, one frame or five a message, and stalls of ``stall_ms`` every 50–600 ms."""
    rng = random.Random(seed)
    out_ms, back_ms = rng.randint(0, 15), rng.randint(0, 15)
    carrier = RealTimeCarrier(phase=rng.randrange(FRAME_MS))
    ledger = PlayoutLedger(frame_ms=FRAME_MS, lead_ms=200, frames_per_message=rng.choice([1, 5]))
    recorder = ledger.recorder = StereoRecorder(
        rate_hz=8000, agent_rate_hz=8000, agent_encoding=AudioEncoding.PCMU, started_ms=START_MS
    )
    greeting = (np.random.default_rng(seed).standard_normal(8 * 1800) * 3000).astype(np.int16)
    frames = [bytes(encode_from_pcm16(AudioEncoding.PCMU, greeting[i : i + FRAME].tobytes())) for i in range(0, len(greeting), FRAME)]
    from_engine = deque([(START_MS, frames[:50]), (START_MS + rng.randint(300, 900), frames[50:])])
    stalls: list[tuple[int, int]] = []  # (from, ms) on the call's clock
    at = 50
    while at < CALL_MS - 500:
        at += rng.randint(50, 600)
        stalls.append((at, rng.choice(stall_ms)))
        at += stalls[-1][1]
    stalled = {START_MS + at + i for at, ms in stalls for i in range(ms)}
    to_carrier: deque[tuple[int, SendMedia | SendMark | SendClear]] = deque()
    to_bridge: deque[tuple[int, str]] = deque()
    written: list[bytes] = []
    caller_ms = 0
    cut_ms: int | None = None
    for now in range(START_MS, START_MS + CALL_MS):
        carrier.tick(now)
        while to_carrier and to_carrier[0][0] <= now:
            carrier.receive(now, to_carrier.popleft()[1])
        to_bridge.extend((at + back_ms, name) for at, name in carrier.echoes)
        carrier.echoes.clear()
        if now in stalled:
            continue
        while from_engine and from_engine[0][0] <= now:
            _, later = from_engine.popleft()
            if cut_ms is None:  # the call refuses the rest of a response cut off
                ledger.enqueue("greeting", later, now)
        if barge_in_ms is not None and cut_ms is None and now - START_MS >= barge_in_ms:  # once the bridge runs
            ledger.flush(now)
            cut_ms = now - START_MS
        while to_bridge and to_bridge[0][0] <= now:
            ledger.mark_echoed(to_bridge.popleft()[1], now)
        ledger.tick(now)
        to_carrier.extend((now + out_ms, action) for action in ledger.actions_to_send())
        ledger.heard_updates()
        while caller_ms + FRAME_MS <= now - START_MS:  # the caller's side: silence, as received
            recorder.caller(bytes(FRAME * 2))
            caller_ms += FRAME_MS
        chunk = recorder.take(now)
        if chunk is not None:
            written.append(chunk)
    written.append(recorder.take(START_MS + CALL_MS, final=True) or b"")
    heard: list[Run] = []
    for at, pcm in carrier.heard:
        if heard and heard[-1].at_ms + len(heard[-1].pcm) // 8 == at - START_MS:
            heard[-1] = Run(heard[-1].at_ms, np.concatenate([heard[-1].pcm, pcm]))
        else:
            heard.append(Run(at - START_MS, pcm))
    recorded = np.frombuffer(b"".join(written), dtype=np.int16)[1::2]
    return Outcome(heard, recorded, out_ms, back_ms, stalls, cut_ms)


@pytest.mark.parametrize("seed", range(200))
def test_stalls_of_the_bridge_the_carrier_plays_through_leave_the_recording_as_heard(seed: int) -> None:
    """Stalls of 5–60 ms, shorter than what the carrier holds (the lead less a message and the network): the caller
    hears the greeting whole, and the recording has it whole, where it was heard. (Before: 26 of these 200 seeds
    failed — an echo the bridge read late after a stall moved a run not yet written, up to 59 ms, and a barge-in's
    cut then fell short of what was heard.)"""
    rng = random.Random(seed)
    outcome = simulate(seed, barge_in_ms=rng.randint(600, 2200) if seed % 2 else None)
    assert len(outcome.heard) == 1, outcome.describe()
    outcome.assert_as_heard()


@pytest.mark.parametrize("seed", range(100))
def test_stalls_longer_than_the_carrier_holds_leave_every_frame_heard_in_the_recording_once(seed: int) -> None:
    """Stalls up to 250 ms, longer than the carrier holds: the caller hears the greeting break off and go on, and
    the recording has every frame heard, once, in order, within 50 ms of where heard (the carrier's 20 ms clock and
    the network's delay are not seen after a break), nothing else. (Before: 51 of these 100 seeds failed — the echoes
    read late after a break had the rest sent placed back to back with what came before it.)"""
    simulate(seed, stall_ms=(5, 25, 60, 150, 250)).assert_every_frame_heard_once_in_order(within_ms=50)
