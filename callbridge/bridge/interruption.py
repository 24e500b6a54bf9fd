"""The bridge's interruption policy (#41: ``barge_in.mode = "bridge"``), sans-I/O: whether the caller's sound over the
agent means *stop*. Pause first, then confirm or resume.

The engine's own barge-in stops the agent on the first speech its VAD hears — the agent's echo, a cough, an
"mm-hm". Here the bridge decides from the caller's audio, frame by frame (a VAD's verdict on what is left once the
agent's echo is taken out; ``speech`` below), while the agent is audible to the caller:

- a speech run (gaps shorter than ``gap_ms`` bridged: between syllables, and where the echo hides the caller's
  quieter ones; in a pause, any gap short of a resume) that lasts ``pause_after_ms`` over the agent **pauses** it:
  the carrier's buffer is cleared and nothing more is sent, the rest of the reply kept (``PlayoutLedger.pause``);
- the run reaching ``confirm_after_ms`` from its onset **confirms** the barge-in: the engine is told (``barge_in``,
  the heard position), and the caller's words from the onset go to it whole (from the onset of a pause resumed
  just before, where there was one: ``_REJOIN_MS``);
- a quiet line for ``resume_after_silence_ms`` before that (for ``gap_ms`` once the caller has said more than a
  backchannel, ``backchannel_max_ms``) **resumes** the reply where the caller stopped hearing it
  (``PlayoutLedger.resume``: a backchannel, a cough that got past the pause); so does a pause that outlives
  ``max_pause_ms`` with the caller's speech never reaching confirmation (sporadic noise). Silence here is a *quiet*
  line: a sound the agent's echo could explain (its tail still coming back after the pause) may be the caller
  going on, and resuming over it would be the agent talking over them — it holds the decision instead.

Sound while the agent is silent is no interruption (the engine's turn-taking hears it); nor is a run shorter than
``pause_after_ms`` (a click, a door). The times are the call's (ms, from outside); nothing here reads a clock.

The decision core: ``bridge/interruption_judge.py`` composes it with the echo gate, ``bridge/bridge_barge_in.py`` acts
on its verdicts in a call (``barge_in.mode = "bridge"``, whose settings these are); ``bench/interruption_core.py``
and ``bench/barge_in.py`` measure it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Confirm", "InterruptionPolicy", "InterruptionSettings", "Pause", "Resume", "Verdict"]

_REJOIN_MS = 600
"""Speech this soon after a resume goes on from what paused the agent before (the caller was between two phrases:
"No, — no, I need Tuesday"): it pauses the agent at once; it confirms once the two together reach
``confirm_after_ms + pause_after_ms`` of speech (and it ``pause_after_ms``), or it alone ``confirm_after_ms``; and the
engine is sent the words from the first one's onset."""


@dataclass(frozen=True, slots=True)
class InterruptionSettings:
    pause_after_ms: int = 80
    """Speech over the agent for this long (from its onset) pauses the agent (100 before session 37: 80 pauses on a
    cough or a click a little more often, and stops the agent 20 ms sooner for a real interruption)."""
    confirm_after_ms: int = 600
    """Speech for this long from its onset confirms the barge-in (the backchannels measured for #41: 280–460 ms)."""
    resume_after_silence_ms: int = 220
    """A quiet line this long in a pause, before confirmation, resumes the reply (speech in a pause goes on from
    the pause's onset across shorter gaps). At 120 (before session 37) an interruption's first word, then a gap
    between words, resumed the agent and the next word paused it again — the caller heard the agent stutter on,
    500–680 ms p95 of it after their onset; at 220 (and a pause at 80 ms), 260–300 ms, and the dead air after a
    backchannel ("mm-hm" ends, the agent goes on) is 220 ms p95 (``bench/barge_in_corpus.py``, ``bench/barge_in.py``;
    ``bench/RESULTS.md``)."""
    gap_ms: int = 200
    """A gap in speech shorter than this does not end the run (between syllables, a VAD's flicker, and the
    caller's quieter syllables the echo hides: the gate hears double talk at its loud peaks)."""
    backchannel_max_ms: int = 300
    """The longest speech taken for a backchannel: in a pause, once the caller's speech has lasted this long from its
    onset, the line must be quiet for ``gap_ms`` where that is longer than ``resume_after_silence_ms`` to resume —
    they are more likely between two words than done ("mm-hm" is 250–450 ms; a pause between phrases 150–200 ms).
    At the defaults (``resume_after_silence_ms`` 220, ``gap_ms`` 200) it changes nothing; it does where a call sets
    a shorter resume."""
    max_pause_ms: int = 1500
    """A pause never lasts longer: past it, unconfirmed, the reply resumes."""

    def resume_after_ms(self, said_ms: int) -> int:
        """The quiet that resumes a pause in which the caller has said ``said_ms`` (from the pause's onset)."""
        if said_ms < self.backchannel_max_ms:
            return self.resume_after_silence_ms
        return max(self.gap_ms, self.resume_after_silence_ms)

    def __post_init__(self) -> None:
        if not 0 < self.pause_after_ms <= self.confirm_after_ms:
            raise ValueError("pause_after_ms must be positive and at most confirm_after_ms")
        if min(self.resume_after_silence_ms, self.gap_ms) <= 0 or self.max_pause_ms < self.confirm_after_ms:
            raise ValueError("resume_after_silence_ms and gap_ms must be positive, max_pause_ms at least confirm_after_ms")


@dataclass(frozen=True, slots=True)
class Pause:
    """Stop the agent now (clear the carrier, send nothing more), keeping the rest of its reply."""

    onset_ms: int


@dataclass(frozen=True, slots=True)
class Resume:
    """Play the rest of the reply from where the caller stopped hearing it: it was not an interruption."""

    onset_ms: int
    speech_ms: int
    """How much speech there was from the onset to the resume (a backchannel the model may be told of)."""
    paused_ms: int


@dataclass(frozen=True, slots=True)
class Confirm:
    """A barge-in: tell the engine (the heard position), and send it the caller's words from ``onset_ms``."""

    onset_ms: int


Verdict = Pause | Resume | Confirm


class _State(enum.Enum):
    LISTENING = "listening"
    PAUSED = "paused"


class InterruptionPolicy:
    """One call's interruption decisions (see the module docstring). ``frame`` takes each analysed frame of the
    caller's audio, in order, and says what to do, if anything."""

    def __init__(self, settings: InterruptionSettings | None = None) -> None:
        self.settings = settings or InterruptionSettings()
        self._state = _State.LISTENING
        self._onset_ms: int | None = None
        """The current speech run's first speech frame."""
        self._speech_end_ms = 0
        """The end of the run's last speech frame."""
        self._sound_end_ms = 0
        """The end of the last frame that was not quiet (speech, or a sound the echo could explain)."""
        self._speech_ms = 0
        """Speech heard since the run's onset, or since the pause's."""
        self._paused_at_ms = 0
        self._paused_onset_ms = 0
        """The onset of the run that paused the agent (later runs in the pause may start anew, short of a gap)."""
        self._resumed: tuple[int, int, int] | None = None
        """The last resume: when, and the onset and speech (ms) of what paused the agent then (``_REJOIN_MS``)."""
        self._rejoined: tuple[int, int] | None = None
        """This run began soon after a resume: the onset and speech of what paused the agent before it."""

    @property
    def paused(self) -> bool:
        return self._state is _State.PAUSED

    def frame(self, at_ms: int, ms: int, *, speech: bool, agent_audible: bool, quiet: bool | None = None) -> Verdict | None:
        """The frame of the caller's audio from ``at_ms``, ``ms`` long: ``speech`` whether it holds the caller's speech
        (not the agent's echo); ``agent_audible`` whether the caller is hearing the agent at ``at_ms`` (a pause
        counts as audible: the reply is held, not over); ``quiet`` whether the line holds no sound worth the name
        (None: as not ``speech``) — only quiet counts towards a resume."""
        end_ms = at_ms + ms
        if speech or quiet is False:
            self._sound_end_ms = end_ms
        if not agent_audible and not self.paused:
            self._onset_ms = None  # speech over the agent counts from when the caller hears it
            return None
        if speech:
            if self._onset_ms is None or (at_ms - self._speech_end_ms >= self.settings.gap_ms and not self.paused):
                self._onset_ms, self._speech_ms = at_ms, 0  # a new run; in a pause, speech goes on from the pause's
                resumed = self._resumed
                self._rejoined = resumed[1:] if resumed is not None and at_ms - resumed[0] <= _REJOIN_MS else None
            self._speech_ms += ms
            self._speech_end_ms = end_ms
        elif self._onset_ms is not None and end_ms - self._speech_end_ms >= self.settings.gap_ms and not self.paused:
            self._onset_ms = None  # the run is over, short of a pause
        if self.paused:
            return self._while_paused(end_ms)
        if self._onset_ms is None or not speech:
            return None
        if end_ms - self._onset_ms < self.settings.pause_after_ms and self._rejoined is None:
            return None
        self._state, self._paused_at_ms, self._paused_onset_ms = _State.PAUSED, end_ms, self._onset_ms
        return Pause(self._onset_ms)

    def _while_paused(self, now_ms: int) -> Verdict | None:
        onset = self._onset_ms
        assert onset is not None
        settings = self.settings
        rejoined = self._rejoined
        if self._speech_end_ms - onset >= settings.confirm_after_ms or (
            rejoined is not None and rejoined[1] + self._speech_ms >= settings.confirm_after_ms + settings.pause_after_ms
            and self._speech_ms >= settings.pause_after_ms
        ):  # fmt: skip
            self._reset()
            return Confirm(onset if rejoined is None else rejoined[0])  # what paused the agent before was their start
        silent_for = now_ms - max(self._speech_end_ms, self._sound_end_ms)
        resume_after = settings.resume_after_ms(self._speech_end_ms - self._paused_onset_ms)
        if silent_for >= resume_after or now_ms - self._paused_at_ms >= settings.max_pause_ms:
            verdict = Resume(self._paused_onset_ms, self._speech_ms, now_ms - self._paused_at_ms)
            before = self._rejoined
            self._resumed = (now_ms, self._paused_onset_ms, self._speech_ms) if before is None else (now_ms, before[0], before[1] + self._speech_ms)
            self._reset()
            return verdict
        return None

    def agent_stopped(self) -> None:
        """The agent's reply is over or cancelled some other way (its end, a hang-up): nothing is paused any more."""
        self._reset()
        self._resumed = None

    def _reset(self) -> None:
        self._state, self._onset_ms, self._speech_ms, self._rejoined = _State.LISTENING, None, 0, None
