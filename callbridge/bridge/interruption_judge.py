"""Bridge-mode barge-in's decision, whole and sans-I/O (#41): the echo gate and the interruption policy composed for
one call, fed the two sides of the line frame by frame.

``heard(pcm)`` takes each frame the caller heard (the agent, or silence while it is quiet or paused), ``caller(pcm,
at_ms)`` each frame the caller's line sent, in step; ``caller`` answers with the policy's verdict (``Pause``,
``Resume``, ``Confirm``) or None. A frame counts as the caller's speech where the echo gate finds more in it than
the agent's echo (``EchoGate``) and it is at least ``speech_db`` loud — and, once their own level is known from a
turn of theirs (``caller_said``), no more than ``below_caller_db`` under it; the agent is audible while the caller
heard it within ``audible_gap_ms`` (or it is paused: the reply is held, not over).

Energy stands in for a VAD here: the engine's VAD still decides the caller's turns; this only decides whether
sound over the agent stops it. ``bridge/bridge_barge_in.py`` feeds it in a call and acts on its verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

import numpy as np

from callbridge.bridge.echo_gate import EchoGate, level_db
from callbridge.bridge.interruption import InterruptionPolicy, InterruptionSettings, Verdict

__all__ = ["BargeInChoice", "BridgeBargeInSettings", "InterruptionJudge"]

_LEVEL_FROM_FRAMES: Final = 10
"""The caller's level is measured from at least this many loud frames of their turn (0.2 s)."""


@dataclass(frozen=True, slots=True)
class BridgeBargeInSettings:
    """``barge_in.mode = "bridge"`` on one call: the policy's times and the judge's levels (``[barge_in]``, or the
    call's assistant's ``turn_taking.barge_in``)."""

    policy: InterruptionSettings = field(default_factory=InterruptionSettings)
    speech_db: float = 45.0
    below_caller_db: float = 15.0


BargeInChoice = BridgeBargeInSettings | Literal["engine"]
"""Who decides barge-in on a call: the bridge, with these settings, or the engine."""


class InterruptionJudge:
    def __init__(
        self,
        policy: InterruptionPolicy | None = None,
        gate: EchoGate | None = None,
        *,
        speech_db: float = 45.0,
        below_caller_db: float = 15.0,
        audible_gap_ms: int = 200,
    ) -> None:
        self.policy = policy or InterruptionPolicy()
        self.gate = gate or EchoGate()
        self.speech_db = speech_db
        self.below_caller_db = below_caller_db
        self.caller_db: float | None = None
        """How loud the caller speaks (``caller_said``); None: not heard yet."""
        self._floor_db = speech_db
        self.frame_ms = self.gate.settings.frame_ms
        self._audible_frames = max(1, audible_gap_ms // self.frame_ms)
        self._since_heard = self._audible_frames  # not heard yet
        self._far_active_db = self.gate.settings.far_active_db
        self.line_sounding = False
        """Whether the last frame ``caller`` took was at least ``speech_db`` loud (the caller's, the echo, anything)."""
        self.caller_speaking = False
        """Whether the last frame ``caller`` took was the caller's speech (more than the echo, loud enough)."""

    def heard(self, pcm: bytes) -> None:
        """The next frame the caller heard."""
        self.heard_level(level_db(pcm))

    def heard_level(self, db: float) -> None:
        """The next frame the caller heard, by its level (``echo_gate.level_db``; 0: silence)."""
        self.gate.far_level(db)
        self._since_heard = 0 if db >= self._far_active_db else self._since_heard + 1

    @property
    def agent_audible(self) -> bool:
        return self._since_heard < self._audible_frames or self.policy.paused

    def caller_said(self, pcm: bytes, rate_hz: int) -> None:
        """The caller's line while the agent was quiet (their last turn, PCM16 at ``rate_hz``): how loud they speak —
        the 90th percentile of its frames at ``speech_db`` or more, where there are at least ten. From then on a
        sound more than ``below_caller_db`` under that is not theirs (a voice across the room, a television), and
        counts as quiet in a pause."""
        samples = rate_hz * self.frame_ms // 1000
        frames = np.frombuffer(pcm[: len(pcm) // (2 * samples) * 2 * samples], dtype="<i2").astype(np.float64).reshape(-1, samples)
        levels = 20 * np.log10(np.floor(np.sqrt((frames * frames).mean(axis=1))) + 1)  # level_db, all frames at once
        loud = levels[levels >= self.speech_db]
        if len(loud) >= _LEVEL_FROM_FRAMES:
            self.caller_db = float(np.percentile(loud, 90))
            self._floor_db = max(self.speech_db, self.caller_db - self.below_caller_db)

    def caller(self, pcm: bytes, at_ms: int) -> Verdict | None:
        """The next frame the caller's line sent (from ``at_ms``): the verdict it brings, if any."""
        near_db = level_db(pcm)
        self.line_sounding = near_db >= self.speech_db
        loud = near_db >= self._floor_db
        self.caller_speaking = self.gate.near_level(near_db) and loud
        return self.policy.frame(at_ms, self.frame_ms, speech=self.caller_speaking, agent_audible=self.agent_audible, quiet=not loud)

    def agent_stopped(self) -> None:
        """The reply ended or was cancelled some other way: nothing is paused."""
        self.policy.agent_stopped()
