"""The agent's turns around the caller's, sans-I/O parts of a call stream (``CallSession`` composes them):

- ``SilenceWatch``: a caller who says nothing is prompted once, then said goodbye to (``SilencePolicy``).
- ``GreetingGuard``: a greeting that may not be cut: the engine hears silence for the caller until it has played.
- ``AfterReply``: what waits for the agent's reply to play out: a tool's result the model answers once the agent is
  silent (and the engine was told so), and the hang-up the agent (``end_call``) or a silent caller's goodbye asked for.

Each is told what it needs of the playout as arguments (the reply arriving, the ledger); none sends anything itself:
they answer what is due, and the call stream says it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from callbridge.bridge.end_reason import EndReason
from callbridge.bridge.playout import PlayoutLedger
from callbridge.stall import PROCESS_STALL_MS

__all__ = ["AfterReply", "GreetingGuard", "SilencePolicy", "SilencePrompt", "SilenceWatch"]

SILENCE_RECHECK_MS: Final = 100
"""A silence deadline held back (the agent replying, a tool running) is looked at again this much later."""
GREETING_WAIT_MS: Final = 5000
"""How long a greeting that may not be cut keeps the caller from the engine while its reply has not begun."""
GOODBYE_WAIT_MS: Final = 5000
"""How long a silent caller's hang-up waits for the goodbye's reply to start; then it goes ahead without it."""
TOLD_WAIT_MS: Final = 1000
"""How long after its playout a tool's result waits for the engine to be told the last response was heard, before
the model is asked to answer it anyway."""


@dataclass(frozen=True, slots=True)
class SilencePolicy:
    """A caller who says nothing (``[silence]``, or the call's assistant). Silence is the line's: neither the caller
    nor the agent speaking, counted from whichever spoke last (or from the session's start). After ``reprompt_ms``
    of it the model is told ``reprompt`` — once, until the caller speaks again; after ``hangup_ms`` it is told
    ``goodbye`` and the call is hung up once that has played (so a prompted caller has ``hangup_ms`` to answer).
    0: off."""

    reprompt_ms: int = 0
    reprompt: str = ""
    hangup_ms: int = 0
    goodbye: str = ""


@dataclass(frozen=True, slots=True)
class SilencePrompt:
    """What the caller's silence calls for now: the model is told ``text`` and asked to answer; ``hang_up``: it is the
    goodbye (the call is hung up once it has played)."""

    text: str
    hang_up: bool
    quiet_ms: int


class SilenceWatch:
    """A caller who says nothing (``SilencePolicy``): when the line has been quiet long enough, the prompt — never
    while the agent is speaking, a reply is coming or a tool is running (``busy``)."""

    __slots__ = ("policy", "speaking", "active_ms", "reprompted", "checked_ms", "put_off_until_ms")

    def __init__(self) -> None:
        self.policy: SilencePolicy | None = None
        self.speaking = False
        self.active_ms = 0
        """When the caller last started or stopped speaking (or the session bound): silence counts from there."""
        self.reprompted = False
        """The caller was prompted since they last spoke (once only)."""
        self.checked_ms = -1
        """When the silence was last looked at (``SILENCE_RECHECK_MS`` from it, at the earliest, again)."""
        self.put_off_until_ms = -1
        """A verdict found due on a tick ``PROCESS_STALL_MS`` late waits until then (``check``)."""

    def bound(self, policy: SilencePolicy | None, now_ms: int) -> None:
        self.policy, self.active_ms = policy, now_ms

    def caller_spoke(self, *, speaking: bool, now_ms: int) -> None:
        """The caller started (``speaking``) or stopped speaking."""
        self.speaking, self.active_ms, self.reprompted = speaking, now_ms, False

    @property
    def watching(self) -> bool:
        """There is a policy and the caller is not speaking."""
        return self.policy is not None and not self.speaking

    def quiet_since_ms(self, playing_until_ms: int) -> int:
        """Since when neither the caller nor the agent has spoken (the session's start at the earliest)."""
        return max(self.active_ms, playing_until_ms)

    def due_ms(self, playing_until_ms: int) -> int | None:
        """When the caller's silence next calls for something, or None."""
        policy = self.policy
        if policy is None or self.speaking:  # not ``watching``: mypy narrows ``policy`` here
            return None
        quiet_since, due = self.quiet_since_ms(playing_until_ms), []
        if policy.hangup_ms:
            due.append(quiet_since + policy.hangup_ms)
        if policy.reprompt_ms and not self.reprompted:
            due.append(quiet_since + policy.reprompt_ms)
        # held back (the agent replying, a tool running): looked at again a little later, not at every tick
        return max(min(due), self.checked_ms + SILENCE_RECHECK_MS, self.put_off_until_ms) if due else None

    def check(self, now_ms: int, playing_until_ms: int, *, busy: bool) -> SilencePrompt | None:
        """The prompt the silence calls for now, if any (``watching`` first). Found due on a tick at least
        ``PROCESS_STALL_MS`` late, the verdict waits that long: this process did not run, and what the caller said
        meanwhile is still unread (``callbridge/stall.py``): the silence is the bridge's, not the caller's."""
        policy = self.policy
        assert policy is not None
        # every deadline lies past the last look (``due_ms``): only a tick that long after it can be that late, so
        # the deadline is worked out then, not on each of the ticks that pace a reply out
        due = self.due_ms(playing_until_ms) if now_ms - self.checked_ms >= PROCESS_STALL_MS else None
        self.checked_ms = now_ms
        if due is not None and now_ms - due >= PROCESS_STALL_MS:
            self.put_off_until_ms = now_ms + PROCESS_STALL_MS
            return None
        if busy:
            return None
        quiet_ms = now_ms - self.quiet_since_ms(playing_until_ms)
        if policy.hangup_ms and quiet_ms >= policy.hangup_ms:
            return SilencePrompt(policy.goodbye, True, quiet_ms)
        if policy.reprompt_ms and not self.reprompted and quiet_ms >= policy.reprompt_ms:
            self.reprompted = True
            return SilencePrompt(policy.reprompt, False, quiet_ms)
        return None


class GreetingGuard:
    """A greeting that may not be cut: until it has played the engine hears silence in place of the caller
    (vllm-omni cancels any response its VAD hears speech over, so nothing else keeps it from being cut); where its
    reply has not begun, for ``GREETING_WAIT_MS`` at most."""

    __slots__ = ("muted_until_ms", "response_id")

    def __init__(self) -> None:
        self.muted_until_ms: int | None = None
        self.response_id: str | None = None
        """The greeting's reply, once it began (the new session's first)."""

    def guard(self, now_ms: int) -> None:
        self.muted_until_ms = now_ms + GREETING_WAIT_MS

    def reply_began(self, response_id: str) -> None:
        if self.muted_until_ms is not None and self.response_id is None:
            self.response_id = response_id  # the first reply of a new session: the greeting

    def mutes(self, now_ms: int, replying: str | None, ledger: PlayoutLedger) -> bool:
        """Whether the caller's audio now is muted: the greeting is still to come or playing (then, for good, not)."""
        if self.muted_until_ms is None:
            return False
        if self.response_id is None:
            plays = now_ms < self.muted_until_ms  # its reply has not begun: not waited for forever
        else:
            plays = replying == self.response_id or ledger.is_playing(now_ms)
        if not plays:
            self.muted_until_ms = None
        return plays


class AfterReply:
    """What waits for the agent's reply to have played out: the model's answer to a tool's result (``respond``), and
    the hang-up (``hang_up_reason``: the agent's ``end_call``, or a silent caller's goodbye)."""

    __slots__ = ("hang_up_reason", "goodbye_due_ms", "hang_up_checked_ms", "respond", "respond_checked_ms", "last_response")

    def __init__(self) -> None:
        self.hang_up_reason: EndReason | None = None
        """The agent asked to end the call: the reason, until its audio has played and the call is hung up."""
        self.goodbye_due_ms: int | None = None
        """A silent caller's goodbye was asked for: the hang-up waits for its reply until then."""
        self.hang_up_checked_ms = -1
        """When a hang-up after playout was last looked at (a deadline at or before it is spent)."""
        self.respond = False
        """A tool's result went to the model while the agent spoke: a response is asked for when that one ends."""
        self.respond_checked_ms = -1
        """When ``respond_due`` last looked (its deadlines are the ones after)."""
        self.last_response: str | None = None
        """The response whose audio came last (``respond_due`` waits until the engine was told all of it)."""

    def reply_began(self, response_id: str) -> None:
        self.last_response = response_id
        self.goodbye_due_ms = None  # a goodbye asked for is this reply: it plays, then the hang-up

    def end_call_asked(self) -> None:
        self.hang_up_reason = self.hang_up_reason or EndReason.AGENT_HUNG_UP

    def goodbye_asked(self, now_ms: int, reason: EndReason = EndReason.CALLER_SILENT) -> None:
        """The model was asked for a last reply (a silent caller's goodbye, a machine's voicemail): the hang-up, for
        ``reason``, once it has played (or ``GOODBYE_WAIT_MS`` passed without it)."""
        self.hang_up_reason = reason
        self.goodbye_due_ms = now_ms + GOODBYE_WAIT_MS  # its reply plays first (if it comes)

    def hang_up_due(self, now_ms: int, replying: str | None, ledger: PlayoutLedger) -> EndReason | None:
        """The reason to hang up now: the reply being received has ended, its audio has played, and the goodbye
        asked for (if any) has come or was waited for long enough."""
        reason = self.hang_up_reason
        self.hang_up_checked_ms = now_ms
        if reason is None or replying is not None or ledger.is_playing(now_ms):
            return None
        if self.goodbye_due_ms is not None and now_ms < self.goodbye_due_ms:
            return None  # the goodbye asked for has not come yet
        return reason

    def respond_due(self, now_ms: int, *, responding: bool, told_all: bool, playing_until_ms: int) -> bool:
        """Whether the model is now to answer a tool's result that reached it while the agent spoke: once that has
        played out and the engine was told so (``told_all`` of ``last_response``: it refuses a response while it
        counts the last one as playing, ``response_already_active``); at most ``TOLD_WAIT_MS`` after the playout,
        told or not (a carrier's last mark lost)."""
        self.respond_checked_ms = now_ms
        if responding:
            return False
        if told_all or now_ms >= playing_until_ms + TOLD_WAIT_MS:
            self.respond = False
            return True
        return False

    def deadline_ms(self, ledger: PlayoutLedger) -> int | None:
        """The next moment to look again, while nothing more of a reply is arriving: the playout's end (and the
        goodbye's wait) for a hang-up, the playout's end and ``TOLD_WAIT_MS`` after it for a tool's answer — each
        once (a deadline at or before the last look is spent: no busy loop on it) — and the ledger's next frame."""
        if self.hang_up_reason is not None:
            ends = [d for d in (ledger.playing_until_ms, self.goodbye_due_ms) if d is not None and d > self.hang_up_checked_ms]
            deadlines = [d for d in (ledger.next_deadline_ms(), *ends) if d is not None]
            return min(deadlines) if deadlines else None
        until = ledger.playing_until_ms
        due = (until, until + TOLD_WAIT_MS)
        deadlines = [d for d in (ledger.next_deadline_ms(), *due) if d is not None and d > self.respond_checked_ms]
        return min(deadlines) if deadlines else None
