"""The simulated carrier's playback: a tick plays what had reached it by its time, even when it runs late."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from callbridge.sim import carrier as sim_carrier
from callbridge.sim.carrier import CallResult, SimCall, SimStream

pytestmark = pytest.mark.core

FRAME = (3000).to_bytes(2, "little", signed=True) * 160
"""20 ms of agent audio, PCM16 8 kHz."""


class _Stream(SimStream):
    async def send_audio(self, pcm_8k: bytes) -> None: ...

    async def send_dtmf(self, digit: str) -> None: ...

    async def send_stop(self) -> None: ...

    def receive(self, message: str | bytes) -> None: ...

    def mark_message(self, name: str) -> str | None:
        return None


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    now = SimpleNamespace(s=100.0)
    monkeypatch.setattr(sim_carrier, "time", SimpleNamespace(monotonic=lambda: now.s))
    return now


def _stream() -> _Stream:
    return _Stream(None, "s1", 8000, SimCall("c1", CallResult("c1"), lambda: 0))  # type: ignore[arg-type]


def test_a_late_tick_plays_what_was_queued_by_its_time_and_not_what_came_after(clock: SimpleNamespace) -> None:
    """Ticks catching up after a stall (due at 100.02 … 100.08, run at 100.3): the two frames queued before them
    play at once, the frame that came at 100.3 not before the tick due then — silence where the carrier had
    nothing, as a carrier playing in real time hears it (a burst of ticks must not pull later audio early)."""
    stream = _stream()
    stream.enqueue_audio(FRAME * 2)
    clock.s = 100.3
    stream.enqueue_audio(FRAME)
    heard = [stream.play(100.0 + 0.02 * tick) for tick in range(1, 5)]
    assert [agent for _, agent in heard] == [True, True, False, False]
    assert heard[2][0] == bytes(320) and len(stream.queue) == 320
    assert stream.play(100.3) == (FRAME, True) and not stream.queue  # its own tick plays it


def test_a_frame_played_in_parts_keeps_the_arrival_of_each(clock: SimpleNamespace) -> None:
    """Pieces smaller than a frame, and a frame split across two pieces: each byte plays by its own arrival."""
    stream = _stream()
    stream.enqueue_audio(FRAME[:200])
    clock.s = 100.1
    stream.enqueue_audio(FRAME[200:] + FRAME)
    frame, agent = stream.play(100.05)  # only the first piece had come: played, the rest of the frame silent
    assert agent and frame == FRAME[:200] + bytes(120)
    assert stream.play(100.1) == (FRAME[200:] + FRAME[:200], True)
    assert stream.play() == (FRAME[200:] + bytes(200), True) and not stream.queue


def test_a_clear_drops_what_had_come(clock: SimpleNamespace) -> None:
    stream = _stream()
    stream.enqueue_audio(FRAME * 3)
    stream.clear()
    clock.s = 101.0
    stream.enqueue_audio(FRAME)
    assert stream.play(100.5)[1] is False and stream.play(101.0) == (FRAME, True)
