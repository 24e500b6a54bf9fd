"""What the caller heard of the agent's replies, over the whole call: sans-I/O, one per stream, carried to the next
stream in the resume ticket.

Per response (the newest few): what the engine generated (``generated``), the most the engine was told the caller
heard of it (``told``: by this stream, the stream before, or the engine itself acknowledging), the replies a stream's
end cut off while they were being generated and how much of each the earlier streams played (``cut_replies``), and
the truncations the engine reported. A stream that took the call over from a dead process holds what it would tell
(``hold_tells_until``) until the engine's replay is in, then tells only what the engine was not told already.
``CallSession`` asks it what to tell the engine (``tell``), and sends that.
"""

from __future__ import annotations

from typing import Final

from callbridge.engine.commands import AckPlayback, EngineCommand, TruncateItem

__all__ = ["CUT_REPLIES_KEPT", "GENERATED_KEPT", "HeardAccount"]

CUT_REPLIES_KEPT: Final = 8
"""Cut-off replies a ticket carries: an engine goes on generating only the newest (older ones ended)."""
GENERATED_KEPT: Final = 16
"""Responses whose generated length is kept (the newest: only they are still acked or truncated)."""


class HeardAccount:
    """What the caller heard of each recent response over the call, and what the engine was told of it. See the
    module docstring."""

    __slots__ = ("_generated_ms", "_told", "_held_tells", "held_until_ms", "_truncated_by_engine", "_cut_replies")

    def __init__(self) -> None:
        self._generated_ms: dict[str, float] = {}
        """Audio the engine generated per response (the newest few), in ms: the last frame is padded to 20 ms, and
        what the engine is told was heard never exceeds what it generated."""
        self._told: dict[str, int] = {}
        """The most the engine was told the caller heard of each response (the newest few): by this stream, by the
        stream before (a live ticket's ``told_ms``), or as it acknowledges (``playback.acknowledged``, replayed to a
        stream that took the call over from a dead process). Nothing this stream tells it of a response goes lower."""
        self._held_tells: dict[str, tuple[int, bool]] = {}
        """A takeover's tells while its replay comes in: response id → the most heard of it and whether to truncate
        it there."""
        self.held_until_ms: int | None = None
        """Until when tells are held (a takeover's replay coming in), or None."""
        self._truncated_by_engine: dict[str, None] = {}
        """Responses whose truncation the engine has reported (``conversation.item.truncated``), the newest few."""
        self._cut_replies: dict[str, int] = {}
        """Replies a stream's end cut off while they were being generated (this stream's end or an earlier one's):
        response id → ms the caller heard of it on the streams before this one. Their audio here continues from
        there: what the engine is told of them is that plus what this stream played."""

    # ------------------------------------------------------------- generated

    def response_began(self) -> None:
        """A new response's audio begins: the oldest generated length goes where the table is full."""
        generated = self._generated_ms
        if len(generated) >= GENERATED_KEPT:
            del generated[next(iter(generated))]

    def generated(self, response_id: str, ms: float) -> None:
        """``ms`` more of ``response_id``'s audio came from the engine."""
        self._generated_ms[response_id] = self._generated_ms.get(response_id, 0.0) + ms

    def generated_ms(self, response_id: str) -> float | None:
        """What the engine generated of ``response_id`` (on this stream and, for a cut reply, the rest the last stream
        had not played), or None where nothing is known."""
        return self._generated_ms.get(response_id)

    # ----------------------------------------------------------------- heard

    def on_call(self, response_id: str, heard_ms: int) -> int:
        """What the caller heard of ``response_id`` over the call, from ``heard_ms`` played on this stream: no more
        than the engine generated here (the last frame is padded), after what earlier streams played of it."""
        generated = self._generated_ms.get(response_id)
        heard = heard_ms if generated is None else min(heard_ms, int(generated))
        return heard + self._cut_replies.get(response_id, 0)

    def cut(self, response_id: str, heard_on_call_ms: int) -> None:
        """A stream's end cut ``response_id`` off while it was being generated (or played), heard this far."""
        self._cut_replies[response_id] = heard_on_call_ms

    def heard_before(self, response_id: str) -> int:
        """What the streams before this one played of a reply they cut off (0 for any other)."""
        return self._cut_replies.get(response_id, 0)

    @property
    def cut_replies(self) -> tuple[tuple[str, int], ...]:
        """The replies cut off by a stream's end while being generated, newest last, with what the caller heard of
        each over the call (the resume ticket's ``heard_ms``)."""
        return tuple(self._cut_replies.items())[-CUT_REPLIES_KEPT:]

    def with_playing(self, response_id: str, heard_on_call_ms: int) -> tuple[tuple[str, int], ...]:
        """``cut_replies`` and the reply still being generated, heard this far (a live ticket's ``heard_ms``)."""
        replies = dict(self._cut_replies)
        replies[response_id] = heard_on_call_ms
        return tuple(replies.items())[-CUT_REPLIES_KEPT:]

    # ------------------------------------------------------------------ told

    def note_told(self, response_id: str, heard_ms: int) -> int:
        """What to tell the engine the caller heard of ``response_id`` (an ack, a truncation), from ``heard_ms``:
        never less than it was told before, which now holds this."""
        told = self._told
        if response_id not in told and len(told) >= GENERATED_KEPT:
            del told[next(iter(told))]
        told[response_id] = heard = max(told.get(response_id, 0), heard_ms)
        return heard

    def told(self, response_id: str) -> int:
        return self._told.get(response_id, 0)

    @property
    def told_so_far(self) -> tuple[tuple[str, int], ...]:
        """The most the engine was told the caller heard of each recent response (a ticket's ``told_ms``)."""
        return tuple(self._told.items())

    def engine_truncated(self, response_id: str, audio_end_ms: int) -> None:
        """The engine reported it truncated ``response_id`` at ``audio_end_ms`` (``conversation.item.truncated``)."""
        truncated = self._truncated_by_engine
        truncated[response_id] = None
        if len(truncated) > GENERATED_KEPT:
            del truncated[next(iter(truncated))]
        self.note_told(response_id, audio_end_ms)

    def tell(self, response_id: str, heard_ms: int, *, truncate: bool) -> EngineCommand | None:
        """What tells the engine the caller heard ``heard_ms`` of ``response_id``: an ack, or a truncation there;
        never less than it was told before (``note_told``). None while tells are held (``hold_tells_until``)."""
        if self.held_until_ms is not None:
            held, held_truncate = self._held_tells.pop(response_id, (0, False))
            self._held_tells[response_id] = (max(held, heard_ms), held_truncate or truncate)
            return None
        return self._told_command(response_id, heard_ms, truncate=truncate)

    def _told_command(self, response_id: str, heard_ms: int, *, truncate: bool) -> EngineCommand:
        heard = self.note_told(response_id, heard_ms)
        if truncate:
            return TruncateItem(f"item_{response_id}", heard)
        return AckPlayback(response_id, heard, f"item_{response_id}")

    def hold_tells_until(self, until_ms: int) -> None:
        """A stream that took the call over from a dead process: what it tells waits for the engine's replay."""
        self.held_until_ms = until_ms

    def release_held(self) -> list[EngineCommand]:
        """The replay is in: what was held, where the engine was not told as much (by the dead stream, in the
        replay) — a truncation the engine reported already is not made again."""
        self.held_until_ms = None
        held, self._held_tells = self._held_tells, {}
        commands: list[EngineCommand] = []
        for response_id, (heard, truncate) in held.items():
            if truncate and response_id not in self._truncated_by_engine:
                commands.append(self._told_command(response_id, heard, truncate=True))
            elif heard > self._told.get(response_id, 0):
                commands.append(self._told_command(response_id, heard, truncate=False))
        return commands

    def drop_held(self) -> None:
        """The session is another stream's now: nothing held is this one's to tell."""
        self.held_until_ms, self._held_tells = None, {}
