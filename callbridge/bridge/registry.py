"""What the bridge remembers about a call between its streams: the engine session to resume, the call's
timeline, whether it has ended; and the single-use tokens that let a media stream in.

Two backends behind one async interface, chosen by ``registry.backend``: in memory (one process, the
default) and Redis (``callbridge.bridge.registry_redis``: several processes or hosts behind a load balancer,
where a call's webhook, its media socket and its next stream may each reach a different process). Keyed by
the call id (``CallSid``…), never the stream id. Entries expire with the engine's disconnect grace: a stream
that comes later starts a new engine session.

Every method is a round trip to Redis in production: call them when a stream starts, ends or is answered,
never per frame.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import hmac
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from callbridge.bridge.registry_journal import JournalPage, MemoryJournal
from callbridge.engine.port import ResumeTicket

__all__ = [
    "ENDED_KEPT_MS",
    "CallClaim",
    "LONGEST_CALL_FALLBACK_S",
    "TOKEN_TTL_MS",
    "CallRecord",
    "CallRegistry",
    "CallSignal",
    "LiveCall",
    "MemoryCallRegistry",
    "MemoryStreamTokens",
    "RegistryUnavailable",
    "SignalKind",
    "StreamTokens",
    "counters_kept_ms",
    "holder_process",
    "stream_holder",
]

ENDED_KEPT_MS = 600_000
"""How long an ended call is remembered, so that a late redirect or stream for it is refused."""
LONGEST_CALL_FALLBACK_S = 86_400.0
"""The longest call assumed where ``server.max_call_duration_s`` is 0 (no limit)."""


def counters_kept_ms(max_call_duration_s: float) -> int:
    """How long a call's counters (a carrier's answered / over / restarts) are kept after their last change: past
    the longest call, and as long as an ended call is remembered after it."""
    return int((max_call_duration_s or LONGEST_CALL_FALLBACK_S) * 1000) + ENDED_KEPT_MS


TOKEN_TTL_MS = 120_000
"""How long a minted stream token stays valid (the carrier opens the stream within seconds)."""


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class RegistryUnavailable(Exception):
    """The shared registry could not be reached (Redis down, a timeout). The calls that needed it at that moment
    go on without it where they can (a stream is refused, a detached session closed); none is left hanging."""

    def __init__(self, operation: str, detail: str) -> None:
        super().__init__(f"registry {operation}: {detail}")
        self.operation = operation
        self.detail = detail


def stream_holder(process_id: str, stream_id: str) -> str:
    """A stream as the registry names the one that holds a call (``LiveCall.holder``)."""
    return f"{process_id}:{stream_id}"


def holder_process(holder: str) -> str:
    """The process of a ``stream_holder``: it is alive while it listens (``CallRegistry.listening``)."""
    return holder.partition(":")[0]


@dataclass(frozen=True, slots=True)
class LiveCall:
    """Where a live call stands, for another process to resume its engine session should the one serving it die
    (a crash: no detach, no ticket): written as its stream binds and kept current while it is up
    (``CallRegistry.checkpoint``)."""

    holder: str
    """The stream that holds the session (``<process id>:<stream id>``): only it may update this, and a claim
    names it, so a stream that took the call over is never overwritten by the one it took it from."""
    ticket: ResumeTicket
    """The session's resume state as last written (its token, the last event its stream had taken)."""
    input_ms: int = 0
    """Where the call's input timeline stood then."""

    def to_dict(self) -> dict[str, Any]:
        return {"holder": self.holder, "ticket": self.ticket.to_dict(), "input_ms": self.input_ms}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LiveCall:
        return cls(str(data["holder"]), ResumeTicket.from_dict(data["ticket"]), int(data.get("input_ms", 0)))


@dataclass(slots=True)
class CallRecord:
    call_id: str
    ticket: ResumeTicket | None = None
    """The detached engine session, resumable until the record expires."""
    input_ms: int = 0
    """Where the call's input timeline stood when its last stream ended."""
    ended_reason: str | None = None
    """Set once the call is over (hung up, refused): a redirected webhook then hangs up."""
    bound: bool = False
    """A stream holds the call's engine session now (``mark_bound``): a new stream that finds no ticket is
    racing that stream's detach, and waits a moment for it rather than open a second session."""
    live: LiveCall | None = None
    """The bound stream's live ticket: what resumes the session if that stream's process died."""
    holder: str | None = None
    """The stream that holds the call's session: the bound one (``live.holder``), or one that took it over from a
    dead one's live ticket and is binding it. Only it may detach the session or bring the live ticket up to date."""


@dataclass(frozen=True, slots=True)
class CallClaim:
    """What a new stream's one look at its call's record found and took (``CallRegistry.claim_call``)."""

    ended_reason: str | None = None
    """Why the call is over (None: it is not)."""
    ticket: ResumeTicket | None = None
    """The parked session's ticket, taken for this stream (None: none waited, or the call is over)."""
    input_ms: int = 0
    """Where the call's input timeline stood."""
    bound: bool = False
    """A stream holds the call's session (no ticket was waiting): its detach may be on the way."""
    live_holder: str | None = None
    """That stream, where it left a live ticket (``LiveCall.holder``)."""


class SignalKind(enum.Enum):
    CALL_ENDED = "call_ended"
    """A carrier's webhook says the call is over; ``detail`` is the reason. Its live stream ends as on a stop."""
    STREAM_DROPPED = "stream_dropped"
    """A carrier's webhook says a media socket dropped (a ``disconnected`` event); ``detail`` is the stream's token,
    empty for every stream of the call. The stream is ended as lost (its engine session detached for the next)."""
    STREAM_SUPERSEDED = "stream_superseded"
    """The carrier opened a new stream for the call (it reconnected) while a stream still holds the call's engine
    session: that stream's connection is half-open (the drop never reached it). It is ended as lost, so its
    detach hands the engine session to the new stream now rather than at its idle timeout."""
    DTMF = "dtmf"
    """A carrier's webhook says the caller pressed a key (where its media socket carries no digits); ``detail`` is the digit. The call's
    stream takes it as a digit on the wire."""
    STREAM_BOUND = "stream_bound"
    """The call's stream bound its engine session on the process that sends it, which counts the call now: a
    process that admitted the call's answer lets that slot go (held until ``engine.open_at_answer_ttl_s``, it counted
    the call a second time against its ``server.max_calls`` and CPU budget: ``serve --workers N`` refused calls at
    about half their capacity). Sent only by a process that had not admitted the call itself."""
    DIAL_PROGRESS = "dial_progress"
    """A carrier's word on a call the agent placed (a status callback, its answer webhook) reached a process that did
    not place it: ``detail`` is JSON (``carrier``, ``status``, ``detail``, ``dial_id``); the process that placed the
    call follows it as its own (``Dialer``), the others ignore it."""
    STREAM_ENDED = "stream_ended"
    """A carrier's webhook says a media socket ended as the end of the call (the websocket leg
    ``completed``); ``detail`` is the stream's token. The call ends as on a stop, if that stream is still its stream."""


@dataclass(frozen=True, slots=True)
class CallSignal:
    """Word from a carrier's webhook for whichever process serves the call's stream: the webhook and the media
    socket of one call may reach different processes. Best effort and prompt; what must hold without it is in the
    call's record too (``mark_ended``), which every stream reads as it ends."""

    call_id: str
    kind: SignalKind
    detail: str
    origin: str
    """The process that sent it (``BridgeServices.process_id``); its own ``listen`` does not return it."""


class CallRegistry(abc.ABC):
    """call id → ``CallRecord``, expiring; shared by every process that serves the call's number.

    Beside the record: per-call counters a carrier's webhooks keep (answers, stream restarts, reconnects: any
    process may get the next webhook), and signals from the process that got a webhook to the one that serves the
    call's stream.
    """

    @abc.abstractmethod
    async def get(self, call_id: str) -> CallRecord | None:
        """The call's record, or None when unknown or expired. Every method raises ``RegistryUnavailable`` when
        the backend cannot be reached."""

    @abc.abstractmethod
    async def detach(self, call_id: str, ticket: ResumeTicket, input_ms: int, grace_ms: int, holder: str | None = None) -> bool:
        """Keep a detached call's engine session for ``grace_ms`` (the record expires then). ``holder``: the stream
        detaching it, which must still hold the call: False, nothing written, when another stream has taken it
        over (this one was taken for dead; the session is that stream's now)."""

    @abc.abstractmethod
    async def claim_ticket(self, call_id: str, expected: ResumeTicket | None = None) -> tuple[ResumeTicket | None, int]:
        """Take the call's resume ticket and its timeline offset, atomically: of two processes that claim at
        once, one gets the ticket. With ``expected``: only if that is still the ticket waiting."""

    @abc.abstractmethod
    async def claim_call(self, call_id: str, unless_ended: bool) -> CallClaim:
        """A new stream's look at its call, in one round trip and atomically: the call's ticket taken (as
        ``claim_ticket``); where none waited, whether a stream holds the call's session and which (as ``get``).
        ``unless_ended``: a call known over is not looked into (its ``ended_reason`` alone)."""

    @abc.abstractmethod
    async def mark_bound(self, call_id: str, keep_ms: int, live: LiveCall) -> None:
        """A stream has bound the call's engine session (until its ``detach`` or ``mark_ended``; the mark of a
        process that died lapses after ``keep_ms``); ``live`` is its live ticket (its holder the stream)."""

    @abc.abstractmethod
    async def checkpoint(self, call_id: str, live: LiveCall, keep_ms: int) -> bool:
        """Bring the call's live ticket up to date, only if ``live.holder`` still holds the call (bound, not
        detached, ended or taken over since). False when it does not (nothing written). A call the registry has
        no record of at all was lost by it (Redis restarted empty, or failed over to a replica that never had
        it; nobody can take a call over without its record): written anew as ``mark_bound`` would, kept
        ``keep_ms``, so that the call is resumable from the registry again."""

    @abc.abstractmethod
    async def claim_live(self, call_id: str, holder: str, by: str) -> LiveCall | None:
        """Take the call's live ticket from ``holder`` (a stream that will never detach: its process died or
        stopped answering) for the stream ``by``, which holds the call from now on (``holder``'s late detach is
        refused), atomically: of two streams that claim at once, one gets it; None when ``holder`` no longer
        holds the call (it detached meanwhile, or another stream took it)."""

    @abc.abstractmethod
    async def mark_ended(self, call_id: str, reason: str, keep_ms: int = ENDED_KEPT_MS) -> None:
        """The call is over: drop its ticket and remember why for ``keep_ms``."""

    async def ended_reason(self, call_id: str) -> str | None:
        record = await self.get(call_id)
        return record.ended_reason if record else None

    @abc.abstractmethod
    async def count(self, call_id: str, counter: str, keep_ms: int, by: int = 1) -> int:
        """Add ``by`` to the call's ``counter`` (0 when new) and return the sum, atomically: of two processes that
        count at once, each sees its own sum. The call's counters are kept ``keep_ms`` from this write, apart from
        its record (whose expiry follows the engine session)."""

    @abc.abstractmethod
    async def counts(self, call_id: str) -> dict[str, int]:
        """The call's counters (empty when none, or expired)."""

    @abc.abstractmethod
    async def keep_note(self, call_id: str, kind: str, text: str, keep_ms: int) -> None:
        """Keep a note of the call's for its streams on any process, ``keep_ms`` from now, replacing the one of
        ``kind`` before: its setup (``CallSetup``: the context and the assistant its application chose, where the
        call was answered), its report so far (``CallReportBuilder``, as a stream hands the call on)."""

    @abc.abstractmethod
    async def note(self, call_id: str, kind: str) -> str | None:
        """The call's note of ``kind`` (``keep_note``), or None: none kept, or expired."""

    @abc.abstractmethod
    async def journal(
        self, call_id: str, entries: list[str], keep_ms: int, header: str | None = None, opened_at: float | None = None,
        ended_at: float | None = None, calls_kept: int = 2000, writer: str | None = None,
    ) -> None:  # fmt: skip
        """Add ``entries`` (events, JSON) to the call's journal for the console (``registry_journal``), all of it kept
        ``keep_ms`` from now: ``header`` (its context, JSON) replaces the one before; ``opened_at`` (Unix s) puts a
        call not listed yet among the calls up now, ``ended_at`` moves it to the finished ones (the newest
        ``calls_kept`` kept); ``writer``: the bridge process writing (``journal_of`` says the last)."""

    @abc.abstractmethod
    async def journal_of(self, call_id: str) -> JournalPage:
        """The call's journal (an empty page: none, or expired)."""

    @abc.abstractmethod
    async def journaled(self, live: bool, limit: int, offset: int = 0) -> list[str]:
        """The calls up now (``live``: newest opened first) or finished (newest ended first), at most ``limit``, the
        first ``offset`` of that order passed over (the console's search pages through the finished ones)."""

    @abc.abstractmethod
    async def announce(self, process_id: str, status: str, keep_ms: int) -> None:
        """The bridge process ``process_id`` says how it stands (JSON: ``console_fleet``), for ``keep_ms``."""

    @abc.abstractmethod
    async def announced(self) -> list[str]:
        """Every bridge's last announcement that has not lapsed (``announce``), by process id."""

    @abc.abstractmethod
    async def signal(self, signal: CallSignal) -> None:
        """Send ``signal`` to every other process's ``listen`` (fire and forget: a process not listening at that
        moment misses it)."""

    @abc.abstractmethod
    def listen(self, process_id: str) -> AsyncIterator[CallSignal]:
        """The signals other processes send, from now on, until cancelled. Never raises for an unreachable
        backend: it logs, waits and listens again."""

    @abc.abstractmethod
    async def listening(self, process_id: str) -> bool:
        """Whether the process ``process_id`` listens for signals now (``listen``): its connection to the backend
        is open. A process that died (killed, crashed) stops at once, its kernel closing its sockets; one whose host
        vanished (power, network) is still counted until the backend's connection to it times out."""

    @abc.abstractmethod
    async def admit(self, call_id: str, limit: int, hold_ms: int) -> bool:
        """Count the call among the calls every process sharing this registry holds, if fewer than ``limit`` are
        (atomically: of N+k processes admitting at once against N, N succeed); a call counted already is
        admitted again. It is counted for ``hold_ms`` from now (``hold`` keeps it), or until ``release``."""

    @abc.abstractmethod
    async def reserve_dial(self, carrier: str, interval_ms: float, max_wait_ms: int) -> int | None:
        """A turn to dial through ``carrier``, ``interval_ms`` after the turn before it that any process sharing this
        registry reserved (atomically: the fleet's dials through one carrier are never closer than that): how many
        ms from now this one's is. None, and nothing reserved, where it would be more than ``max_wait_ms`` away."""

    @abc.abstractmethod
    async def remember_once(self, key: str, keep_ms: int) -> bool:
        """True, and ``key`` remembered ``keep_ms`` from now, if it is not remembered already (atomically: of two
        processes that ask at once, one gets True); False while it is. What a signed webhook proves itself by
        (``replay.ReplayGuard``), so a replay of it is refused on every process."""

    @abc.abstractmethod
    async def forget(self, key: str) -> None:
        """``key`` is no longer remembered (``remember_once`` is True for it again)."""

    @abc.abstractmethod
    async def hold(self, call_ids: list[str], hold_ms: int) -> None:
        """Keep the calls counted ``hold_ms`` more (a process's calls, now and then): the calls of a process that
        died lapse then."""

    @abc.abstractmethod
    async def release(self, call_id: str) -> None:
        """The call is over: it no longer counts."""

    async def aclose(self) -> None:
        """Release the backend's connections (at shutdown)."""

    async def reachable(self) -> bool:
        """Whether the backend answers now (``/readyz``): a process that cannot reach it can take no new call."""
        return True

    shared: ClassVar[bool] = True
    """Other processes read and write this registry (Redis, or a ``serve --workers`` group's host): they can resume
    this one's calls. False: one process's alone (the answer's session is kept in the process)."""
    spans_hosts: ClassVar[bool] = True
    """Processes of other hosts share it too (Redis: a fleet behind a load balancer), so a draining process can move
    its calls to them. False (one process, or one ``serve --workers`` group, which drains as a whole): a drain
    serves calls in place."""

    levels_fetched: ClassVar[bool] = False
    """``entry_count`` and ``detached_count`` are another process's, the whole group's, as last fetched by
    ``refresh_levels`` (a ``serve --workers`` group's host): every worker reports the same counts."""

    @property
    def entry_count(self) -> int | None:
        """Entries held, where the backend counts them without a round trip (the ``callbridge_registry_entries``
        gauge); None: not known here (the gauge is not exported)."""
        return None

    @property
    def detached_count(self) -> int | None:
        """Calls whose engine session waits, detached, for the call's next stream, where counted without a round
        trip; None: not known here."""
        return None

    async def refresh_levels(self) -> None:
        """Fetch ``entry_count`` and ``detached_count`` where they are another process's (``levels_fetched``);
        nothing where they are counted here or not at all. Raises ``RegistryUnavailable``."""


class StreamTokens(abc.ABC):
    """Single-use tokens minted by the answer webhook and checked in the stream's ``start``.

    Defence in depth beside the signature check: a media socket is bridged only with a token that the
    bridge (any of its processes) minted, for this call, recently, and never used before.
    """

    @abc.abstractmethod
    async def mint(self, call_id: str) -> str: ...

    @abc.abstractmethod
    async def consume(self, token: str | None, call_id: str) -> bool:
        """True once for a token minted for ``call_id`` and not expired."""


# ------------------------------------------------------------------ memory


@dataclass(slots=True)
class _Entry:
    record: CallRecord
    expires_at_ms: int


class MemoryCallRegistry(CallRegistry):
    """The registry of a single process; the clock (ms, monotonic) is injectable."""

    shared: ClassVar[bool] = False
    spans_hosts: ClassVar[bool] = False

    _PRUNE_EVERY_MS = 10_000
    """Expired entries of calls nobody asks about again are dropped this often (amortized over writes), so the
    registry holds the calls of the last ``ENDED_KEPT_MS`` or so, not every call the process ever served."""
    MAX_REMEMBERED = 200_000
    """``remember_once`` keys held at most. Only signed requests are remembered, so this is the carriers' own
    traffic: 200,000 in a replay window of an hour is 55 webhooks a second, far beyond one process's calls."""

    def __init__(self, *, clock: Callable[[], int] = _monotonic_ms) -> None:
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._pruned_at_ms = clock()
        self._counters: dict[str, tuple[dict[str, int], int]] = {}
        """call id → (its counters, when they expire)."""
        self._counters_pruned_at_ms = clock()
        self._notes: dict[tuple[str, str], tuple[str, int]] = {}
        self._notes_pruned_at_ms = clock()
        self._listeners: list[tuple[str, asyncio.Queue[CallSignal]]] = []
        self._admitted: dict[str, int] = {}
        """call id → until when it counts against the fleet's limit (``admit``)."""
        self._dial_turns: dict[str, float] = {}
        """Carrier → when (this clock, ms) the next dial through it may go (``reserve_dial``)."""
        self._remembered: dict[str, int] = {}
        """``remember_once``'s keys → when each is forgotten; at most ``MAX_REMEMBERED`` (the oldest goes first)."""
        self._journal = MemoryJournal(clock)
        """The console's journals of calls (``journal``)."""

    @property
    def entry_count(self) -> int:
        """Entries held, expired ones not yet pruned included (the ``callbridge_registry_entries`` gauge)."""
        return len(self._entries)

    @property
    def detached_count(self) -> int:
        """Calls whose engine session waits, detached, for the call's next stream (its ticket not yet expired)."""
        now = self._clock()
        return sum(entry.record.ticket is not None and now < entry.expires_at_ms for entry in self._entries.values())

    def _prune(self) -> None:
        now = self._clock()
        if now - self._pruned_at_ms < self._PRUNE_EVERY_MS:
            return
        self._pruned_at_ms = now
        for call_id in [c for c, entry in self._entries.items() if now >= entry.expires_at_ms]:
            del self._entries[call_id]
        for key in [k for k, until in self._remembered.items() if now >= until]:
            del self._remembered[key]

    def _live(self, call_id: str) -> _Entry | None:
        entry = self._entries.get(call_id)
        if entry is not None and self._clock() >= entry.expires_at_ms:
            del self._entries[call_id]
            return None
        return entry

    def _entry(self, call_id: str) -> _Entry:
        self._prune()
        entry = self._live(call_id)
        if entry is None:
            entry = self._entries[call_id] = _Entry(CallRecord(call_id), 0)
        return entry

    async def get(self, call_id: str) -> CallRecord | None:
        entry = self._live(call_id)
        if entry is None:
            return None
        return replace(entry.record)

    async def detach(self, call_id: str, ticket: ResumeTicket, input_ms: int, grace_ms: int, holder: str | None = None) -> bool:
        entry = self._entry(call_id)
        if holder is not None and entry.record.holder not in (None, holder):
            return False
        entry.record.bound, entry.record.live, entry.record.holder = False, None, None
        entry.record.ticket = ticket
        entry.record.input_ms = input_ms
        entry.expires_at_ms = self._clock() + grace_ms
        return True

    async def claim_ticket(self, call_id: str, expected: ResumeTicket | None = None) -> tuple[ResumeTicket | None, int]:
        entry = self._live(call_id)
        if entry is None:
            return None, 0
        record = entry.record
        if expected is not None and record.ticket != expected:
            return None, record.input_ms
        ticket, record.ticket = record.ticket, None
        return ticket, record.input_ms

    async def claim_call(self, call_id: str, unless_ended: bool) -> CallClaim:
        entry = self._live(call_id)
        if entry is None:
            return CallClaim()
        record = entry.record
        if unless_ended and record.ended_reason is not None:
            return CallClaim(record.ended_reason, input_ms=record.input_ms)
        ticket, record.ticket = record.ticket, None
        if ticket is not None:
            return CallClaim(record.ended_reason, ticket, record.input_ms)
        holder = record.live.holder if record.live is not None else None
        return CallClaim(record.ended_reason, None, record.input_ms, record.bound, holder)

    async def mark_bound(self, call_id: str, keep_ms: int, live: LiveCall) -> None:
        entry = self._entry(call_id)
        entry.record.bound, entry.record.live, entry.record.holder, entry.record.ticket = True, live, live.holder, None
        entry.expires_at_ms = max(entry.expires_at_ms, self._clock() + keep_ms)

    async def checkpoint(self, call_id: str, live: LiveCall, keep_ms: int) -> bool:
        entry = self._live(call_id)
        if entry is None:
            await self.mark_bound(call_id, keep_ms, live)
            return True
        if not entry.record.bound or entry.record.holder != live.holder:
            return False
        entry.record.live = live
        return True

    async def claim_live(self, call_id: str, holder: str, by: str) -> LiveCall | None:
        entry = self._live(call_id)
        if entry is None or entry.record.live is None or entry.record.holder != holder:
            return None
        live, entry.record.live, entry.record.bound, entry.record.holder = entry.record.live, None, False, by
        return live

    async def mark_ended(self, call_id: str, reason: str, keep_ms: int = ENDED_KEPT_MS) -> None:
        entry = self._entry(call_id)
        entry.record.ended_reason = reason
        entry.record.bound, entry.record.live, entry.record.holder = False, None, None
        entry.record.ticket = None
        entry.expires_at_ms = self._clock() + keep_ms

    async def count(self, call_id: str, counter: str, keep_ms: int, by: int = 1) -> int:
        now = self._clock()
        if now - self._counters_pruned_at_ms >= self._PRUNE_EVERY_MS:
            self._counters_pruned_at_ms = now
            for expired in [c for c, (_, expires_at_ms) in self._counters.items() if now >= expires_at_ms]:
                del self._counters[expired]
        held = self._counters.get(call_id)
        counters = held[0] if held is not None and now < held[1] else {}
        counters[counter] = total = counters.get(counter, 0) + by
        self._counters[call_id] = (counters, now + keep_ms)
        return total

    async def counts(self, call_id: str) -> dict[str, int]:
        held = self._counters.get(call_id)
        return dict(held[0]) if held is not None and self._clock() < held[1] else {}

    async def keep_note(self, call_id: str, kind: str, text: str, keep_ms: int) -> None:
        now = self._clock()
        if now - self._notes_pruned_at_ms >= self._PRUNE_EVERY_MS:
            self._notes_pruned_at_ms = now
            for expired in [key for key, (_, expires_at_ms) in self._notes.items() if now >= expires_at_ms]:
                del self._notes[expired]
        self._notes[(call_id, kind)] = (text, now + keep_ms)

    async def note(self, call_id: str, kind: str) -> str | None:
        held = self._notes.get((call_id, kind))
        return held[0] if held is not None and self._clock() < held[1] else None

    async def journal(
        self, call_id: str, entries: list[str], keep_ms: int, header: str | None = None, opened_at: float | None = None,
        ended_at: float | None = None, calls_kept: int = 2000, writer: str | None = None,
    ) -> None:  # fmt: skip
        self._journal.write(call_id, entries, keep_ms, header, opened_at, ended_at, calls_kept, writer)

    async def journal_of(self, call_id: str) -> JournalPage:
        return self._journal.read(call_id)

    async def journaled(self, live: bool, limit: int, offset: int = 0) -> list[str]:
        return self._journal.calls(live, limit, offset)

    async def announce(self, process_id: str, status: str, keep_ms: int) -> None:
        self._journal.announce(process_id, status, keep_ms)

    async def announced(self) -> list[str]:
        return self._journal.announced()

    async def admit(self, call_id: str, limit: int, hold_ms: int) -> bool:
        now = self._clock()
        admitted = self._admitted
        for lapsed in [c for c, until in admitted.items() if until <= now]:
            del admitted[lapsed]
        if call_id not in admitted and len(admitted) >= limit:
            return False
        admitted[call_id] = now + hold_ms
        return True

    async def reserve_dial(self, carrier: str, interval_ms: float, max_wait_ms: int) -> int | None:
        now = self._clock()
        turn = max(float(now), self._dial_turns.get(carrier, -math.inf))
        if turn - now > max_wait_ms:
            return None
        self._dial_turns[carrier] = turn + interval_ms
        return math.ceil(turn - now)

    async def remember_once(self, key: str, keep_ms: int) -> bool:
        self._prune()
        now = self._clock()
        until = self._remembered.get(key)
        if until is not None and now < until:
            return False
        self._remembered.pop(key, None)  # re-inserted last: the dict stays in insertion order, oldest first
        while len(self._remembered) >= self.MAX_REMEMBERED:
            del self._remembered[next(iter(self._remembered))]
        self._remembered[key] = now + keep_ms
        return True

    async def forget(self, key: str) -> None:
        self._remembered.pop(key, None)

    async def hold(self, call_ids: list[str], hold_ms: int) -> None:
        until = self._clock() + hold_ms
        for call_id in call_ids:
            self._admitted[call_id] = until

    async def release(self, call_id: str) -> None:
        self._admitted.pop(call_id, None)

    async def signal(self, signal: CallSignal) -> None:
        """To the other listeners of this registry (one process has no other: this matters to tests that run
        several bridges on one memory registry)."""
        for process_id, queue in self._listeners:
            if process_id != signal.origin:
                queue.put_nowait(signal)

    async def listening(self, process_id: str) -> bool:
        return any(listener == process_id for listener, _ in self._listeners)

    async def listen(self, process_id: str) -> AsyncIterator[CallSignal]:
        listener = (process_id, asyncio.Queue[CallSignal]())
        self._listeners.append(listener)
        try:
            while True:
                yield await listener[1].get()
        finally:
            self._listeners.remove(listener)


class MemoryStreamTokens(StreamTokens):
    def __init__(self, *, ttl_ms: int = TOKEN_TTL_MS, clock: Callable[[], int] = _monotonic_ms) -> None:
        self._ttl_ms = ttl_ms
        self._clock = clock
        self._tokens: dict[str, tuple[str, int]] = {}

    async def mint(self, call_id: str) -> str:
        self._prune()
        token = secrets.token_urlsafe(24)
        self._tokens[token] = (call_id, self._clock() + self._ttl_ms)
        return token

    async def consume(self, token: str | None, call_id: str) -> bool:
        if not token:
            return False
        entry = self._tokens.pop(token, None)
        if entry is None:
            return False
        minted_for, expires_at = entry
        return hmac.compare_digest(minted_for, call_id) and self._clock() < expires_at

    def _prune(self) -> None:
        now = self._clock()
        for token in [t for t, (_, expires) in self._tokens.items() if expires <= now]:
            del self._tokens[token]
