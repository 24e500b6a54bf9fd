"""Who decides barge-in on one stream, sans-I/O (``barge_in.mode``, #41): the caller's audio in, the engine commands
it becomes out (``CallSession`` sends them), the agent's speech paused, resumed or stopped.

``EngineBargeIn`` (``engine``, the default): each piece of the caller's audio is appended as it is; the engine's VAD
stops the agent on the first speech it hears over a reply.

``BridgeBargeIn`` (``bridge``): while the caller hears the agent, each piece is appended marked *listen*
(``AppendAudio.overlap``: the engine hears it, never barges in, keeps none of it) and judged frame by frame
(``InterruptionJudge``: the echo gate against what the caller hears, then the interruption policy):

- *pause*: the agent's reply is held and the carrier's buffer cleared (``AgentSpeech.pause``);
- *resume*: it plays on from where the caller stopped hearing it (``AgentSpeech.resume``);
- *confirm*: the engine is told to barge in (``BargeIn``: it cancels the reply, whose heard position the agent's
  speech then tells it, as for the engine's own barge-in), and the caller's words are sent again unmarked from
  ``RESEND_BEFORE_ONSET_MS`` before their onset — the engine kept none of what was marked. Where the reply has
  played out by the time a pause is due (the caller's words read late, after a stall), there is nothing to pause or
  confirm: the words are the caller's turn, sent again the same way.

What the gate finds to be only the agent's echo goes to the engine as silence, while the caller hears the agent and
for ``_ECHO_TAIL_MS`` after (its echo may still come back): the engine's VAD never hears it, so neither takes it for
the caller nor starts a turn on its tail. The caller's own speech in that tail goes from its onset.

The engine's ``input_audio_buffer_empty`` after a listened-over utterance is expected here (``expects``): its VAD's
commit at the end of speech it was told to keep none of.
"""

from __future__ import annotations

from collections import deque
from typing import Final, Protocol

from callbridge.bridge.agent_speech import AgentSpeech
from callbridge.bridge.interruption import Confirm, InterruptionPolicy, Pause, Resume
from callbridge.bridge.interruption_judge import BargeInChoice, BridgeBargeInSettings, InterruptionJudge
from callbridge.engine.commands import AppendAudio, BargeIn, EngineCommand
from callbridge.engine.errors import ErrorCode

__all__ = ["RESEND_BEFORE_ONSET_MS", "BargeInDecider", "BridgeBargeIn", "EngineBargeIn", "barge_in_decider"]

RESEND_BEFORE_ONSET_MS: Final = 300
"""How far before the speech's onset a confirmed barge-in's words are sent again (the engine's own
``prefix_padding_ms``: a word's start is quieter than what the gate first took for speech)."""
_KEPT_MS: Final = 5000
"""The caller's audio kept for a confirmation's resend (well past ``max_pause_ms``, the longest a run is judged)."""
_FRAME_MS: Final = 20
_ECHO_TAIL_MS: Final = 600
"""After the caller last heard the agent, how long its echo may still come back (the echo gate's longest path,
500 ms, and a frame or so): what the gate finds to be only echo still goes to the engine as silence meanwhile."""


class BargeInDecider(Protocol):
    def caller_audio(self, audio: bytes, until_ms: int, now_ms: int, speech: AgentSpeech, *, said_until_ms: int) -> list[EngineCommand]:
        """The caller's ``audio`` (PCM16 at the engine's rate, ending at ``until_ms`` of the call's input timeline),
        read at ``now_ms``; said until ``said_until_ms`` on the same clock (its media's own time: a burst read late
        is judged against what the caller heard as it was said): the commands it becomes."""
        ...

    def expects(self, code: str) -> bool:
        """Whether an engine error with ``code`` is this mode's own doing (logged quietly)."""
        ...


class EngineBargeIn:
    """``barge_in.mode = "engine"``: the caller's audio goes as it is; the engine decides."""

    def __init__(self, rate_hz: int) -> None:
        self.rate_hz = rate_hz

    def caller_audio(self, audio: bytes, until_ms: int, now_ms: int, speech: AgentSpeech, *, said_until_ms: int) -> list[EngineCommand]:
        return [AppendAudio(audio, self.rate_hz)]

    def expects(self, code: str) -> bool:
        return False


class BridgeBargeIn:
    """``barge_in.mode = "bridge"``: see the module docstring."""

    def __init__(self, rate_hz: int, settings: BridgeBargeInSettings) -> None:
        self.rate_hz = rate_hz
        self.judge = InterruptionJudge(InterruptionPolicy(settings.policy), speech_db=settings.speech_db, below_caller_db=settings.below_caller_db)
        self._kept: deque[tuple[int, bytes]] = deque()
        """The caller's recent audio: (its start on the input timeline, PCM16), oldest first."""
        self._audible_until_ms = -_ECHO_TAIL_MS
        """Where on the input timeline the caller last heard the agent (its echo may come back ``_ECHO_TAIL_MS``)."""
        self._speech_from_ms: int | None = None
        """The onset of the caller's speech in the echo's tail, where there is some."""
        self._confirmed = False
        """A barge-in was confirmed (or the reply the caller spoke over had played out): nothing is marked until the
        caller hears the agent again, in what they say from ``_confirmed_at_ms`` on (its next reply)."""
        self._confirmed_at_ms = 0
        """When (the driver's clock) the caller's turn was taken for theirs: what they said before then (a backlog
        read late) was heard over the reply already decided on."""

    def caller_audio(self, audio: bytes, until_ms: int, now_ms: int, speech: AgentSpeech, *, said_until_ms: int) -> list[EngineCommand]:
        chunk_ms = len(audio) * 500 // self.rate_hz
        at_ms, said_at_ms = until_ms - chunk_ms, said_until_ms - chunk_ms
        self._keep(at_ms, audio)
        frame, judge = self.rate_hz * 2 * _FRAME_MS // 1000, self.judge
        # the model of what the caller heard moved on the carrier's word (its marks): what was fed the gate over its
        # window may be that far off, and the echo's bound spans as much more (a stalled bridge, a jittery network)
        judge.gate.unsure(speech.playing_moved_ms(now_ms - judge.gate.settings.window_ms))
        agent_heard_db = judge.gate.settings.far_active_db  # a frame the caller hears this loud is the agent speaking
        sent = bytearray()
        for offset in range(0, len(audio), frame):
            piece = audio[offset : offset + frame]
            frame_ms = offset * 1000 // (self.rate_hz * 2)
            heard_db = speech.playing_level_db(said_at_ms + frame_ms)  # what the caller heard as they said it
            self._confirmed = self._confirmed and (heard_db < agent_heard_db or said_at_ms + frame_ms < self._confirmed_at_ms)
            frame_at_ms = at_ms + frame_ms
            echo_over_at_ms = self._audible_until_ms + _ECHO_TAIL_MS
            if frame_at_ms >= echo_over_at_ms and not judge.policy.paused:
                if heard_db < agent_heard_db:
                    judge.gate.idle()  # the agent neither heard nor echoing: nothing to judge (no work while it is quiet)
                    sent += piece
                    continue
                # a reply starts: the caller's line since the last one (their turn) says how loud they speak
                judge.caller_said(self._since(echo_over_at_ms), self.rate_hz)
            judge.heard_level(heard_db)
            verdict = judge.caller(piece, frame_at_ms)
            if judge.agent_audible and not self._confirmed:
                self._audible_until_ms, self._speech_from_ms = frame_at_ms + _FRAME_MS, None
            elif judge.caller_speaking and self._speech_from_ms is None:
                self._speech_from_ms = frame_at_ms
            # the agent's echo (all the gate finds in a frame while the caller hears the agent, or may hear its echo)
            # reaches the engine as silence: its VAD never takes it for the caller, nor starts a turn on its tail
            echo_only = not self._confirmed and not judge.caller_speaking and frame_at_ms < self._audible_until_ms + _ECHO_TAIL_MS
            sent += bytes(len(piece)) if echo_only else piece
            speech.echo_ms += _FRAME_MS if echo_only and judge.line_sounding else 0  # the report's and metric's
            if isinstance(verdict, Pause):
                if not speech.pause(now_ms):  # counted by the agent's speech (its report, its metric)
                    # the reply played out before this was read (a backlog read late): nothing to hold, and the
                    # caller's words are their turn — whole, from before their onset (the engine kept none of them)
                    judge.agent_stopped()
                    self._theirs(now_ms)
                    return [AppendAudio(self._since(verdict.onset_ms - RESEND_BEFORE_ONSET_MS), self.rate_hz)]
            elif isinstance(verdict, Resume):
                speech.resume(now_ms)
            elif isinstance(verdict, Confirm):
                self._theirs(now_ms)
                return [BargeIn(), AppendAudio(self._since(verdict.onset_ms - RESEND_BEFORE_ONSET_MS), self.rate_hz)]
        if self._confirmed:  # the caller's turn now, all of it: the engine cancelled the reply
            return [AppendAudio(audio, self.rate_hz)]
        if judge.agent_audible:
            return [AppendAudio(bytes(sent), self.rate_hz, "listen")]
        if at_ms < self._audible_until_ms + _ECHO_TAIL_MS and self._speech_from_ms is not None:
            self._audible_until_ms = -_ECHO_TAIL_MS  # the caller's own speech in the echo's tail: theirs from its onset
            return [AppendAudio(self._since(self._speech_from_ms - RESEND_BEFORE_ONSET_MS), self.rate_hz)]
        return [AppendAudio(bytes(sent), self.rate_hz)]

    def expects(self, code: str) -> bool:
        return code == ErrorCode.INPUT_AUDIO_BUFFER_EMPTY

    def _theirs(self, now_ms: int) -> None:
        """The caller's turn from here: nothing marked until they hear the agent's next reply."""
        self._confirmed, self._confirmed_at_ms, self._audible_until_ms = True, now_ms, -_ECHO_TAIL_MS

    def _keep(self, at_ms: int, audio: bytes) -> None:
        kept = self._kept
        kept.append((at_ms, audio))
        while kept and kept[0][0] < at_ms - _KEPT_MS:
            kept.popleft()

    def _since(self, from_ms: int) -> bytes:
        """The caller's kept audio from ``from_ms`` of the input timeline on (to a sample)."""
        bytes_per_ms = self.rate_hz * 2 // 1000
        pieces = []
        for start, audio in self._kept:
            skip = max(0, from_ms - start) * bytes_per_ms
            if skip < len(audio):
                pieces.append(audio[skip:])
        return b"".join(pieces)


def barge_in_decider(rate_hz: int, choice: BargeInChoice) -> BargeInDecider:
    """The stream's decider: the bridge's with its settings (``CallOptions.barge_in``, or the call's assistant's
    ``AgentSetup.barge_in``), or the engine's."""
    return EngineBargeIn(rate_hz) if choice == "engine" else BridgeBargeIn(rate_hz, choice)
