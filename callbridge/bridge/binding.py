"""What a call stream is bound to, as one value (``CallSession.engine_bound``): the engine session (its capabilities,
and where a resumed call left off: its timeline, what the caller heard, the rest of a reply) and what the call's
agent is set up to do on it (greeting, tools, silence, recording, limits). Built in one place, ``EngineBinding.of``,
from the lifecycle's ``Bind`` by the media driver and the fault simulator alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from callbridge.application import MachineDetection
from callbridge.bridge.interruption_judge import BargeInChoice
from callbridge.bridge.lifecycle import Bind, BindSource
from callbridge.bridge.turns import SilencePolicy
from callbridge.engine.events import Capabilities
from callbridge.engine.port import UnheardAudio

__all__ = ["AgentSetup", "EngineBinding"]


@dataclass(frozen=True, slots=True)
class AgentSetup:
    """What the call's agent does on a stream (its assistant and the settings, ``bridge/call_config.py``)."""

    greeting: str | None = None
    """The session is new (the call's first stream): the agent speaks first, told this as a text turn with a
    response asked for at once; its reply plays, is heard, cut by barge-in and told as any other."""
    greeting_interruptible: bool = True
    """False: until the greeting has played the engine hears silence in place of the caller (vllm-omni cancels any
    response its VAD hears speech over, so nothing else keeps it from being cut)."""
    application_tools: frozenset[str] = frozenset()
    """The names of the call's application tools (their calls go to the application: ``Perform``)."""
    tool_filler: str | None = None
    """What the agent is told to say while an application tool is slow (``CallSession.tool_slow``)."""
    silence: SilencePolicy | None = None
    """What to do with a caller who says nothing; None: nothing."""
    record: bool = False
    """The stream is recorded from the bind (``CallSession.recorder``; its chunks come out as ``RecordingChunk``)."""
    call_ends_at_ms: int | None = None
    """The call's own limit (its assistant's ``max_duration_s``, on the stream's clock): then it is ended as at
    ``max_call_ms``."""
    turn_silence_ms: int | None = None
    """The session's ``server_vad`` silence where the call's assistant set its own."""
    barge_in: BargeInChoice | None = None
    """Who decides barge-in where the call's assistant chose (``turn_taking.barge_in``); None: ``CallOptions``'s."""
    machine_detection: MachineDetection | None = None
    """A placed call's first stream: the agent's audio is held until who answered is known (``answer_gate``)."""


@dataclass(frozen=True, slots=True)
class EngineBinding:
    """The engine session a stream is bound to, and what the call's agent does on it."""

    capabilities: Capabilities
    call_offset_ms: int | None = None
    """Where this stream starts on the call's timeline (a resumed call's past input)."""
    heard_ms: tuple[tuple[str, int], ...] = ()
    """The replies earlier streams cut off while the engine was still generating them, and how much of each the
    caller heard (the ticket's ``heard_ms``): the rest of such a reply plays here, and what the engine is told of it
    continues from there (never from 0)."""
    unheard: UnheardAudio | None = None
    """The rest of the reply the last stream was playing as it ended; it plays first, from where the caller stopped
    hearing it (where this stream cannot play it, the model's turn is cut to what was heard)."""
    told_ms: tuple[tuple[str, int], ...] = ()
    """What the engine was told the caller heard of recent responses (the ticket's): this stream tells it no less."""
    taken_over: bool = False
    """Resumed from a dead process's live ticket: what this stream would tell the engine of what was heard waits for
    the engine's replay (``TAKEOVER_TELLS_HELD_MS``)."""
    agent: AgentSetup = field(default_factory=AgentSetup)

    @classmethod
    def of(cls, bind: Bind, capabilities: Capabilities, agent: AgentSetup | None = None) -> EngineBinding:
        """The binding the lifecycle's ``Bind`` step makes with a session of ``capabilities``."""
        return cls(
            capabilities, bind.call_offset_ms, bind.heard_ms, bind.unheard, bind.told_ms,
            taken_over=bind.source is BindSource.TAKEN_OVER, agent=agent if agent is not None else AgentSetup(),
        )  # fmt: skip
