"""The world around the bridge in the fault simulator (``sim/faults.py``): the caller's audio, the carrier's side of a
stream, the call's registry record, the engine server, and how the simulation waits and stays quiet."""

from __future__ import annotations

from collections import deque
from collections.abc import Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from callbridge.bridge.call import CallSession
from callbridge.bridge.lifecycle import CallLifecycle
from callbridge.bridge.registry import LiveCall
from callbridge.carriers import CARRIERS
from callbridge.carriers.spec import FarEnd, FarEndMessage
from callbridge.codecs import pcm16_to_ulaw
from callbridge.engine.local.core import LocalSessionCore, SessionState
from callbridge.engine.local.vad import FrameScorer
from callbridge.engine.port import ResumeTicket

__all__ = [
    "SILENCE",
    "SPEECH",
    "Binding",
    "CarrierModel",
    "EngineServerModel",
    "LoudnessScorer",
    "RegistryModel",
    "Silent",
    "Wake",
    "marking_far_end",
    "stream_id",
]

class LoudnessScorer(FrameScorer):
    """Speech is loud (RMS ≥ 0.05 of full scale): deterministic and cheap where Silero is neither."""

    def score(self, frame: np.ndarray) -> float:
        return 0.95 if float(np.sqrt(np.mean(frame.astype(np.float64) ** 2))) >= 0.05 else 0.02


def speech_frames() -> tuple[bytes, ...]:
    """Loud voiced sound (180 Hz and harmonics), μ-law, one 20 ms frame each; 180 Hz repeats every 100 ms."""
    t = np.arange(160 * 5) / 8000
    wave = np.sin(2 * np.pi * 180 * t) + 0.5 * np.sin(2 * np.pi * 540 * t) + 0.3 * np.sin(2 * np.pi * 900 * t)
    ulaw = pcm16_to_ulaw((wave * 7000).astype("<i2").tobytes())
    return tuple(ulaw[i * 160 : (i + 1) * 160] for i in range(5))


SPEECH: Final = speech_frames()


SILENCE: Final = b"\xff" * 160
"""20 ms of μ-law 8 kHz silence: the far end's frame."""


def marking_far_end() -> FarEnd:
    """The far end of the registry's first carrier that plays what it is sent, echoes marks and flushes."""
    spec = next(spec for spec in CARRIERS if spec.far_end is not None and spec.capabilities.marks and spec.capabilities.flush)
    return spec.far_end_wire()


def stream_id(call: CallSession) -> str:
    stream_id = call.codec.stream_id
    assert stream_id is not None, "the stream has started"
    return stream_id


@dataclass(slots=True)
class CarrierModel:
    """The carrier's side of one stream: plays media frames at real time, echoes marks in order once played."""

    queue: deque[tuple[str, bytes | str]] = field(default_factory=deque)
    played_since_ms: int | None = None
    """Watch playback from then on (the engine failed the call: its failure tone comes next)."""
    first_played_at_ms: int | None = None
    """When the first frame played since ``played_since_ms``: the tone was heard."""

    def receive(self, read: FarEndMessage) -> list[str]:
        """A message from the bridge, as the far end read it; returns the marks echoed at once (a clear echoes
        every pending one)."""
        if read[0] == "media":  # a message may join several frames: each plays its 20 ms
            audio = read[1]
            self.queue.extend(("media", audio[i : i + len(SILENCE)]) for i in range(0, len(audio), len(SILENCE)))
        elif read[0] == "mark":
            self.queue.append(read)
            return self._echo_head()
        else:
            echoed = [str(name) for kind, name in self.queue if kind == "mark"]
            self.queue.clear()
            return echoed
        return []

    def play(self, now_ms: int) -> list[str]:
        """One 20 ms tick: play a frame if one waits; returns marks now passed."""
        if self.queue and self.queue[0][0] == "media":
            self.queue.popleft()
            if self.first_played_at_ms is None and self.played_since_ms is not None and now_ms >= self.played_since_ms:
                self.first_played_at_ms = now_ms
        return self._echo_head()

    def _echo_head(self) -> list[str]:
        echoed = []
        while self.queue and self.queue[0][0] == "mark":
            echoed.append(str(self.queue.popleft()[1]))
        return echoed


@dataclass(slots=True)
class RegistryModel:
    """The call's registry record (``bridge/registry.py``'s ``CallRecord``), in memory."""

    ticket: ResumeTicket | None = None
    input_ms: int = 0
    ended_reason: str | None = None
    bound: bool = False
    live: LiveCall | None = None

    def lose(self) -> None:
        """Everything the registry held of the call is gone (the record object stays: the calls share the dict)."""
        self.ticket, self.input_ms, self.ended_reason, self.bound, self.live = None, 0, None, False, None

    def lose_call(self) -> bool:
        """The registry loses the call's record; True where it named a session of a call not known over (a parked
        ticket, or a live one not yet written anew): a stream of the call can no longer find it. A call known over
        is left as it is: losing that changes nothing the caller hears."""
        if self.ended_reason is not None:
            return False
        named = self.ticket is not None or self.live is not None
        self.lose()
        return named

    def is_empty(self) -> bool:
        return self.ticket is None and self.ended_reason is None and not self.bound and self.live is None


@dataclass(slots=True)
class EngineServerModel:
    """The engine server a seed's calls share: room for ``capacity`` sessions at once (``resource_exhausted``
    past it), and every session it opened, with the call that opened it."""

    capacity: int
    sessions: dict[str, tuple[str, LocalSessionCore]] = field(default_factory=dict)
    """session id → (the call that opened it, its core)."""
    orphaned: set[str] = field(default_factory=set)
    """Sessions no bridge can name any more (the registry lost their ticket): the engine's disconnect grace ends
    them (or, one a half-open stream still serves, that socket's keepalive), not the bridge."""

    def in_use(self) -> int:
        return sum(core.state is not SessionState.CLOSED for _, core in self.sessions.values())

    def open_unowned(self) -> list[str]:
        """Sessions still open that some bridge should have closed (not those left to the grace by a loss)."""
        open_ = [sid for sid, (_, core) in self.sessions.items() if core.state is not SessionState.CLOSED]
        return [sid for sid in open_ if sid not in self.orphaned]

    def has_room(self) -> bool:
        return self.in_use() < self.capacity


class Silent:
    """The simulator's log (``StepLog``): it says nothing; a violation says what went wrong."""

    def info(self, event: str, **kw: Any) -> None:
        pass

    def warning(self, event: str, **kw: Any) -> None:
        pass


@dataclass(slots=True)
class Wake:
    """What the executor waits for in the simulation (``sleep_until``): the virtual clock reaching ``at_ms``."""

    at_ms: int

    def __await__(self) -> Generator[Wake, None, None]:
        yield self


@dataclass(slots=True)
class Binding:
    """A stream's binding steps (a coroutine of the executor) and the lifecycle they are of; ``at_ms``: when a
    waiting one goes on."""

    life: CallLifecycle
    steps: Coroutine[Wake, None, None]
    at_ms: int | None = None
