"""A transport's own silence limit (SIP's RTP timeout, AudioSocket's idle limit: ``receive_within``) after this
process stalled: on a loop whose clock jumps as if the process had been stopped, and which reads the peer's
packet after running the timers that came due meanwhile (as uvloop does after a stall). Shipped limits, no waiting:
the jump is the stall."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from callbridge.bridge.carrier_transport import receive_within
from callbridge.carriers.audiosocket.settings import AudioSocketSettings
from callbridge.carriers.sip.settings import SipSettings
from callbridge.stall import PROCESS_STALL_MS

pytestmark = pytest.mark.core

T = TypeVar("T")
RTP_TIMEOUT_S = SipSettings().rtp_timeout_s  # 30 s
IDLE_TIMEOUT_S = AudioSocketSettings().idle_timeout_s  # 10 s
READER_TURN_S = 0.1
"""How long after the late timers the stalled process reads the packets that came meanwhile."""


class StallingLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock can jump ahead: ``stall(s)`` is this process stopped for ``s`` seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled_s = 0.0

    def time(self) -> float:
        return super().time() + self.stalled_s

    def stall(self, seconds: float, then: Callable[[], object] | None = None) -> None:
        """Stop for ``seconds``; ``then``: what the peer sent meanwhile, read once the late timers have run."""
        self.stalled_s += seconds
        if then is not None:
            self.call_later(READER_TURN_S, then)


def run(work: Callable[[StallingLoop], Awaitable[T]]) -> tuple[T | BaseException, float]:
    """``work`` on a fresh ``StallingLoop``: its result (or what it raised) and how long it took on the loop's clock."""
    loop = StallingLoop()
    try:
        began = loop.time()

        async def timed() -> T | BaseException:
            try:
                return await work(loop)
            except TimeoutError as exc:
                return exc

        outcome = loop.run_until_complete(timed())
        return outcome, loop.time() - began
    finally:
        loop.close()


def on_time(took_s: float, expected_s: float) -> bool:
    """``took_s`` is ``expected_s``: 50 ms early at most, and as late as a loaded machine makes the real part of the wait
    (the loop's clock is real time plus the stalls: a CI run beside busy workers once took 12.553 s for 12.5)."""
    return expected_s - 0.05 <= took_s <= expected_s + 0.3


def through_a_stall(limit_s: float, stopped_s: float, sent: bytes | None = None) -> tuple[bytes | BaseException, float]:
    """``receive_within`` a queue of packets, ``limit_s``, this process stopped ``stopped_s`` at once; ``sent``: the
    packet the peer sent meanwhile, read after the late timers."""

    async def work(loop: StallingLoop) -> bytes:
        packets: asyncio.Queue[bytes] = asyncio.Queue()
        loop.call_soon(loop.stall, stopped_s, None if sent is None else (lambda: packets.put_nowait(sent)))
        return await receive_within(packets.get, limit_s)

    return run(work)


def test_a_stall_past_the_rtp_timeout_reads_what_the_peer_sent_meanwhile() -> None:
    outcome, took_s = through_a_stall(RTP_TIMEOUT_S, RTP_TIMEOUT_S + 1, sent=b"rtp")
    assert outcome == b"rtp"
    assert on_time(took_s, RTP_TIMEOUT_S + 1 + READER_TURN_S)


def test_a_peer_silent_through_a_stall_times_out_once_the_reader_has_had_its_turn() -> None:
    outcome, took_s = through_a_stall(IDLE_TIMEOUT_S, IDLE_TIMEOUT_S + 2)
    assert isinstance(outcome, TimeoutError)
    assert on_time(took_s, IDLE_TIMEOUT_S + 2 + PROCESS_STALL_MS / 1000)


def test_a_time_out_only_a_little_late_is_the_peers_silence_at_once() -> None:
    """Late by less than ``PROCESS_STALL_MS`` (a loaded loop, not a stopped process): the limit holds as it was."""
    outcome, took_s = through_a_stall(IDLE_TIMEOUT_S, IDLE_TIMEOUT_S + 0.2, sent=b"late")
    assert isinstance(outcome, TimeoutError)
    assert on_time(took_s, IDLE_TIMEOUT_S + 0.2)


def test_the_extra_wait_is_given_once() -> None:
    """Stalled again during the extra wait, with nothing read between: the time-out stands."""

    async def work(loop: StallingLoop) -> bytes:
        packets: asyncio.Queue[bytes] = asyncio.Queue()
        loop.call_soon(loop.stall, RTP_TIMEOUT_S + 1)
        loop.call_later(RTP_TIMEOUT_S + 1.1, loop.stall, 2.0, lambda: packets.put_nowait(b"too late"))
        return await receive_within(packets.get, RTP_TIMEOUT_S)

    outcome, took_s = run(work)
    assert isinstance(outcome, TimeoutError)
    assert on_time(took_s, RTP_TIMEOUT_S + 1 + 0.1 + 2)


def test_what_comes_in_time_is_returned_and_no_limit_waits_for_ever() -> None:
    async def work(loop: StallingLoop) -> list[bytes]:
        packets: asyncio.Queue[bytes] = asyncio.Queue()
        loop.call_later(0.05, packets.put_nowait, b"first")
        first = await receive_within(packets.get, IDLE_TIMEOUT_S)
        loop.call_soon(loop.stall, 3600, lambda: packets.put_nowait(b"after an hour"))
        return [first, await receive_within(packets.get, None)]

    outcome, _ = run(work)
    assert outcome == [b"first", b"after an hour"]
