"""Outbound audio of one stream: a paced queue with a bounded lead, playback markers, flush, and "heard up to N ms".

Sans-I/O, like websockets' ``Protocol``: inputs (``enqueue``, ``end_response``,
``tick``, ``mark_echoed``, ``flush``) take ``now_ms`` and only queue outputs;
the driver drains ``actions_to_send()`` and ``heard_updates()`` and sleeps
until ``next_deadline_ms()``.

Plan:
- The bridge holds the excess (the engine produces faster than real time);
  the carrier gets at most ``lead_ms`` ahead of what it has played. Our model
  of the carrier's buffer: each frame starts playing when the previous one
  ends, or when it arrives if the buffer ran dry (``_buffer_end_ms``).
- Playback is recorded per response as runs of contiguous audio
  (``_Segment``: from wall time ``start_ms``, response audio ``from_ms``
  onwards, ``length_ms`` long); a new run starts only after an underrun, so
  nothing is allocated per frame. "Heard" at time t is the run position at t.
- Carriers without markers (raw TCP audio, RTP) get heard positions from the model
  alone, reported every ``mark_every_frames`` frames and at a response's end:
  ``next_deadline_ms`` includes when playback reaches the next one.
- Frames go out joined, up to ``frames_per_message`` in one message (carriers that
  play a message of any length): once that many are queued, they wait until
  the lead has room for all of them, so the carrier's buffer swings between
  ``lead_ms`` and ``lead_ms`` less a message, never runs lower for it, and a
  source at real time (one frame queued at a time) still goes out frame by
  frame, with no delay. The model stays per frame.
- Markers (carriers that echo them): one after the message that reaches a
  response's first ``first_mark_frames`` frames — its echo pins where the
  carrier started playing the response (the network, the carrier's buffer) —,
  then after each further ``mark_every_frames``, and one after its last frame,
  named ``<response_id>@<ms>``. An echo
  says playback reached that point: if it comes later than the model
  predicted (the network, the carrier's jitter buffer), the model is shifted
  by the difference, so the heard position stays within about a frame.
  Heard updates from echoes go out as acks (``heard_updates``).
- ``flush`` (barge-in) drops the unsent frames, queues the carrier's clear
  when anything may still be playing, and returns what was heard. Markers
  still outstanding at that moment are echoed by the carrier on clear
  (where its profile says ``marks_echoed_on_clear``): those echoes mean "flushed", not
  "played", and are ignored.
Like LiveKit's ``on_playback_finished(playback_position, interrupted)``, in integer ms.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from callbridge.bridge.recording import StereoRecorder
from callbridge.carriers.base import SendClear, SendMark, SendMedia

__all__ = ["FlushResult", "HeardUpdate", "PlayoutLedger", "Unplayed"]

_MARK_SEPARATOR: Final = "@"
_SENT_KEPT_MS: Final = 2000
"""Sent frames kept (by their length): what the carrier may hold unplayed when the socket drops — the lead, and
as far again as a carrier playing behind our model (found by its marker echoes) can lag."""
_MOVES_KEPT_MS: Final = 5000
"""How long the model's moves (marker echoes that corrected it by half a frame or more) are kept, for ``moved_ms``."""


@dataclass(frozen=True, slots=True)
class HeardUpdate:
    """The caller has heard ``heard_ms`` of response ``response_id`` (cumulative from its start)."""

    response_id: str
    heard_ms: int


@dataclass(frozen=True, slots=True)
class FlushResult:
    """What a flush found: the response that was playing, how much of it was heard and sent."""

    response_id: str | None
    heard_ms: int
    sent_ms: int
    dropped_frames: int
    cleared: bool


@dataclass(frozen=True, slots=True)
class Unplayed:
    """The response playing as the stream ends, and its audio the caller has not heard: from ``from_ms`` (the
    caller's position in it on this stream, rounded down to a frame), the frames sent but not yet played, then
    those still queued here."""

    response_id: str
    from_ms: int
    frames: tuple[bytes, ...]
    ended: bool
    """No more of the response's audio is to come (its last frame was queued)."""


@dataclass(slots=True)
class _Paused:
    """What ``pause`` holds: the response that was playing, its audio the caller had not heard, the responses queued
    behind it, and the pause's own account (``flush``'s, for a barge-in confirmed during it)."""

    response: _Response
    unplayed: Unplayed
    later: list[tuple[_Response, bytes]]
    ended: bool
    result: FlushResult


@dataclass(slots=True)
class _Segment:
    start_ms: int
    from_ms: int
    length_ms: int


@dataclass(slots=True)
class _Response:
    response_id: str
    sent_ms: int = 0
    queued_frames: int = 0
    ended: bool = False
    final_mark_sent: bool = False
    marked_ms: int = 0
    """Where its last marker was put (0: none yet)."""


class PlayoutLedger:
    """See the module docstring for the contract."""

    def __init__(
        self,
        *,
        frame_ms: int = 20,
        lead_ms: int = 200,
        mark_every_frames: int = 5,
        uses_marks: bool = True,
        marks_echoed_on_clear: bool = True,
        flushes: bool = True,
        frames_per_message: int = 1,
        first_mark_frames: int | None = None,
    ) -> None:
        if lead_ms < frame_ms:
            raise ValueError(f"lead_ms {lead_ms} is shorter than one frame ({frame_ms} ms)")
        if not 1 <= frames_per_message <= lead_ms // frame_ms:
            raise ValueError(f"frames_per_message {frames_per_message} is not 1 … the lead's {lead_ms // frame_ms} frames")
        self.frame_ms = frame_ms
        self.lead_ms = lead_ms
        self.frames_per_message = frames_per_message
        self.mark_every_frames = mark_every_frames
        self.first_mark_frames = mark_every_frames if first_mark_frames is None else first_mark_frames
        self.uses_marks = uses_marks
        self.marks_echoed_on_clear = marks_echoed_on_clear
        self.flushes = flushes
        self._queue: deque[tuple[_Response, bytes]] = deque()
        self._sent: deque[bytes] = deque(maxlen=max(1, _SENT_KEPT_MS // frame_ms))
        """The latest frames sent of the current response, the newest ending at its ``sent_ms`` (for ``unplayed``)."""
        self._responses: dict[str, _Response] = {}
        self._current: _Response | None = None
        """The response whose audio the carrier is playing (or will play next)."""
        self._segments: deque[_Segment] = deque()
        self._played_runs: deque[_Segment] = deque()
        """Runs of the current response that finished before a later one began (an underrun), as the model last had
        them, for ``_SENT_KEPT_MS``: the caller's audio said during one may be read only after the next run was sent
        (the bridge stalled), and is judged against what the caller heard then."""
        self._shifted_ms = 0
        """How far marker echoes have moved the current response's runs off the send clock."""
        self._played_floor_ms = 0
        """Where the runs already dropped from ``_segments`` (played in full) ended."""
        self._buffer_end_ms = 0
        self._outstanding: deque[tuple[str, str, int]] = deque()
        """Marks sent and not echoed: (name, response_id, ms)."""
        self._flushed_marks: set[str] = set()
        self._actions: list[SendMedia | SendMark | SendClear] = []
        self._heard: list[HeardUpdate] = []
        self._acked: dict[str, int] = {}
        self.frames_sent = 0
        self.frames_dropped = 0
        self.corrections = 0
        """Times a marker echo moved the playback model (the carrier or the bridge ran off the send clock)."""
        self._moves: deque[tuple[int, int]] = deque()
        """The model's moves by half a frame or more in the last ``_MOVES_KEPT_MS``: (when, how far either way, ms)."""
        self.underruns = 0
        """Times the carrier's buffer ran dry mid-response (a frame sent after the previous one had played)."""
        self.mark_lags_ms: list[int] = []
        """Per marker echo: how much later than sent-and-played-at-once it came (drained by the driver)."""
        self.recorder: StereoRecorder | None = None
        """The call's recording: each frame sent goes to it with when it starts to play; a flush cuts it."""
        self._paused: _Paused | None = None
        """Set by ``pause`` until ``resume`` (or a ``flush``): nothing goes to the carrier meanwhile."""
        self.gated = False
        """Nothing goes to the carrier, all is queued (a placed call's answer not yet known: ``answer_gate``);
        ``ungate`` sends it."""
        self.first_sent_ms: int | None = None
        """When the first frame went to the carrier (None: none yet)."""

    # ------------------------------------------------------------------ inputs

    def enqueue(self, response_id: str, frames: Sequence[bytes], now_ms: int) -> None:
        """Queue ``frames`` of ``response_id``; frames go out in order, paced (all that came at once may go in one
        message). Drain ``actions_to_send()``."""
        response = self._responses.get(response_id)
        if response is None:
            response = self._responses[response_id] = _Response(response_id)
        response.queued_frames += len(frames)
        self._queue.extend([(response, frame) for frame in frames])
        self.tick(now_ms)

    def end_response(self, response_id: str, now_ms: int) -> None:
        """No more frames of ``response_id`` will come: a final marker follows its last frame."""
        response = self._responses.get(response_id)
        if response is None:
            return
        response.ended = True
        if self._paused is not None and self._paused.response is response:
            self._paused.ended = True
        self._maybe_final_mark(response)
        self.tick(now_ms)

    def tick(self, now_ms: int) -> None:
        """Send the frames the lead allows now (and, without markers, report how far playback has got)."""
        if self._paused is not None or self.gated:
            return  # held: the caller may be interrupting, or who answered is not known yet
        queue, per_message = self._queue, self.frames_per_message
        while queue and self._buffer_end_ms - now_ms + self._next_message_frames() * self.frame_ms <= self.lead_ms:
            response, frame = queue.popleft()
            frames = [frame]
            while queue and len(frames) < per_message and queue[0][0] is response:
                frames.append(queue.popleft()[1])
            response.queued_frames -= len(frames)
            self._send_frames(response, frames, now_ms)
        if not self.uses_marks:
            self._report_heard(now_ms)

    def _next_message_frames(self) -> int:
        """The frames the next message waits to carry: every frame queued, up to a message's worth."""
        return min(len(self._queue), self.frames_per_message)

    def mark_echoed(self, name: str, now_ms: int) -> None:
        """The carrier echoed marker ``name``. Drain ``heard_updates()`` next."""
        if name in self._flushed_marks:
            self._flushed_marks.discard(name)
            return
        if not any(sent_name == name for sent_name, _, _ in self._outstanding):
            return  # an echo of a marker we do not know (or already had): markers are ours to name
        while self._outstanding:  # echoes come in order: markers before this one were passed too
            sent_name, response_id, ms = self._outstanding.popleft()
            if sent_name == name:
                self._on_reached(response_id, ms, now_ms)
                return

    def flush(self, now_ms: int) -> FlushResult:
        """Barge-in: drop what is unsent, clear the carrier's buffer if it may hold audio, report the heard ms.

        Later frames of the flushed response are refused by the caller, not here: ``enqueue`` after a flush
        starts playing again at once.
        """
        if self._paused is not None:  # confirmed during a pause: the carrier was cleared then, what was held goes
            paused, self._paused = self._paused, None
            dropped = len(paused.unplayed.frames) + len(self._queue)
            self.frames_dropped += dropped
            self._queue.clear()
            for response in self._responses.values():
                response.queued_frames = 0
            return replace(paused.result, dropped_frames=paused.result.dropped_frames + dropped)
        current = self._current
        sent = current.sent_ms if current is not None else 0
        # a carrier that cannot drop what it holds plays all of it: heard is what was sent
        heard = (self._heard_at(now_ms) if self.flushes else sent) if current is not None else 0
        dropped = len(self._queue)
        playing = self._buffer_end_ms > now_ms or bool(self._outstanding)
        cleared = (playing or dropped > 0) and self.flushes
        for response, _ in self._queue:
            response.queued_frames = 0
        self._queue.clear()
        self.frames_dropped += dropped
        if cleared:
            self._actions.append(SendClear())
        if self.marks_echoed_on_clear:
            self._flushed_marks.update(name for name, _, _ in self._outstanding)
        self._outstanding.clear()
        if self.flushes:
            self._buffer_end_ms = now_ms  # else what was sent still plays out first
            if self.recorder is not None:
                self.recorder.cut(now_ms)
        self._clear_segments()
        result = FlushResult(current.response_id if current else None, heard, sent, dropped, cleared)
        if current is not None:
            current.ended = True
            current.final_mark_sent = True
            self._note_heard(current.response_id, heard)
        self._current = None
        return result

    def pause(self, now_ms: int) -> FlushResult | None:
        """Bridge-mode barge-in's pause (#41): the carrier's buffer cleared and nothing more sent, as ``flush`` does,
        but the response playing is held, not given up — its audio the caller has not heard (from where they
        stopped hearing it, to a frame; a carrier that cannot be cleared plays what it holds, and the reply goes on
        after that), what is queued behind it, and what comes meanwhile wait for ``resume``.
        A ``flush`` during the pause (the barge-in confirmed) drops what was held. Returns the flush's account; None
        where nothing is playing or a pause holds already (nothing changed)."""
        current, unplayed = self._current, self.unplayed(now_ms)
        if self._paused is not None or current is None or unplayed is None:
            return None
        if not self.flushes:  # the carrier plays all it was sent (it has no flush): the reply goes on after that
            played = (current.sent_ms - unplayed.from_ms) // self.frame_ms
            unplayed = replace(unplayed, from_ms=current.sent_ms, frames=unplayed.frames[played:])
        later = [(response, frame) for response, frame in self._queue if response is not current]
        ended = current.ended
        result = self.flush(now_ms)
        self._paused = _Paused(current, unplayed, later, ended, result)
        return result

    @property
    def paused(self) -> bool:
        return self._paused is not None

    def ungate(self, now_ms: int) -> None:
        """What was queued while ``gated`` goes out now, from its start. Drain ``actions_to_send()``."""
        self.gated = False
        self.tick(now_ms)

    def queued_responses(self) -> list[str]:
        """The responses with frames queued here (not sent), in order."""
        return list(dict.fromkeys(response.response_id for response, _ in self._queue))

    def resume(self, now_ms: int) -> None:
        """The pause was no interruption: the held response plays on from where the caller stopped hearing it (the
        frame they were in when it paused, again), then what was queued behind it. Drain ``actions_to_send()``."""
        paused, self._paused = self._paused, None
        if paused is None:
            return
        response = paused.response
        response.sent_ms = response.marked_ms = paused.unplayed.from_ms
        response.ended, response.final_mark_sent = paused.ended, False
        held = list(self._queue)
        queue = [(response, frame) for frame in paused.unplayed.frames]
        queue += [item for item in held if item[0] is response] + paused.later + [item for item in held if item[0] is not response]
        self._queue = deque(queue)
        for each in self._responses.values():
            each.queued_frames = 0
        for each, _ in queue:
            each.queued_frames += 1
        self.tick(now_ms)
        self._maybe_final_mark(response)

    def unplayed(self, now_ms: int) -> Unplayed | None:
        """What the caller has not heard yet of the response playing (by the model, corrected by echoes): for the
        call's next stream to play, where the socket drops. None when nothing is playing, or when the caller is
        further behind than the frames kept. Changes nothing (a ``flush`` follows)."""
        paused = self._paused
        if paused is not None:  # what the pause holds, and what came for the response since
            since = tuple(frame for response, frame in self._queue if response is paused.response)
            held = paused.unplayed
            return Unplayed(held.response_id, held.from_ms, held.frames + since, paused.ended)
        current = self._current
        if current is None:
            return None
        heard = self._heard_at(now_ms)
        start = heard - heard % self.frame_ms
        kept_from = current.sent_ms - len(self._sent) * self.frame_ms
        if start < kept_from:  # not kept back that far
            return None
        sent = tuple(self._sent)[(start - kept_from) // self.frame_ms :]
        frames = sent + tuple(frame for response, frame in self._queue if response is current)
        if not frames:
            return None
        return Unplayed(current.response_id, start, frames, current.ended)

    # ----------------------------------------------------------------- outputs

    def actions_to_send(self) -> list[SendMedia | SendMark | SendClear]:
        actions, self._actions = self._actions, []
        return actions

    def heard_updates(self) -> list[HeardUpdate]:
        """New heard positions (monotonic per response), oldest first."""
        updates, self._heard = self._heard, []
        return updates

    def next_deadline_ms(self) -> int | None:
        """When the lead next allows a frame to go, if any is waiting; without markers, also when playback
        reaches the next position to report."""
        if self._paused is not None or self.gated:
            return None  # nothing goes out until ``resume`` (``ungate``)
        deadline = self._buffer_end_ms + self._next_message_frames() * self.frame_ms - self.lead_ms if self._queue else None
        if not self.uses_marks:
            target = self._next_report_ms()
            report_at = self._time_of(target) if target is not None else None
            if report_at is not None:
                deadline = report_at if deadline is None else min(deadline, report_at)
        return deadline

    # ------------------------------------------------------------------ queries

    @property
    def queued_frames(self) -> int:
        return len(self._queue)

    @property
    def playing_until_ms(self) -> int:
        """When what has been sent finishes playing (by the model)."""
        return self._buffer_end_ms

    def lead_at(self, now_ms: int) -> int:
        """ms of audio the carrier holds (by our model) at ``now_ms``."""
        return max(0, self._buffer_end_ms - now_ms)

    def heard_ms(self, response_id: str, now_ms: int) -> int:
        """The caller's position in ``response_id`` at ``now_ms`` (by the model, corrected by echoes)."""
        if self._current is not None and self._current.response_id == response_id:
            return self._heard_at(now_ms)
        return self._acked.get(response_id, 0)

    def playing_frame(self, at_ms: int) -> bytes | None:
        """The frame the caller hears at ``at_ms`` (now, or a moment ago: by the model, as echoes corrected it), as it
        was sent; None: silence (nothing playing then, or paused)."""
        current = self._current
        if current is None or self._paused is not None or not self._sent:
            return None
        kept_from = current.sent_ms - len(self._sent) * self.frame_ms
        for segment in itertools.chain(self._segments, self._played_runs):
            if segment.start_ms <= at_ms < segment.start_ms + segment.length_ms:
                index = (segment.from_ms + at_ms - segment.start_ms - kept_from) // self.frame_ms
                return self._sent[index] if 0 <= index < len(self._sent) else None
        return None

    def moved_ms(self, since_ms: int) -> int:
        """The most a marker echo moved the model since ``since_ms`` (up to ``_MOVES_KEPT_MS`` back), either way: how
        far off what the caller heard the model may have been meanwhile (0: never by half a frame or more)."""
        return max((moved for at_ms, moved in self._moves if at_ms >= since_ms), default=0)

    def is_playing(self, now_ms: int) -> bool:
        """Audio is queued here or still playing at the carrier."""
        return bool(self._queue) or self._buffer_end_ms > now_ms

    # ----------------------------------------------------------------- internals

    def _send_frames(self, response: _Response, frames: list[bytes], now_ms: int) -> None:
        """One message of ``response``'s next ``frames``, then a marker if it reached the next one's place."""
        if self.first_sent_ms is None:
            self.first_sent_ms = now_ms
        if self._current is not response:
            self._current = response
            self._clear_segments()
            self._sent.clear()
        length_ms = self.frame_ms * len(frames)
        start = max(now_ms, self._buffer_end_ms)
        last = self._segments[-1] if self._segments else None
        if last is not None and last.start_ms + last.length_ms == start:
            last.length_ms += length_ms
        else:
            # a new run (after an underrun): runs that finished playing before now are done with
            if last is not None:
                self.underruns += 1
            while self._segments and self._segments[0].start_ms + self._segments[0].length_ms <= now_ms:
                done = self._segments.popleft()
                self._played_floor_ms = max(self._played_floor_ms, done.from_ms + done.length_ms)
                self._played_runs.append(done)
            while self._played_runs and self._played_runs[0].start_ms + self._played_runs[0].length_ms <= now_ms - _SENT_KEPT_MS:
                self._played_runs.popleft()
            self._segments.append(_Segment(start, response.sent_ms, length_ms))
        self._buffer_end_ms = start + length_ms
        self._sent.extend(frames)
        if self.recorder is not None:
            for offset, frame in enumerate(frames):
                self.recorder.agent(start + offset * self.frame_ms, frame, now_ms)
        response.sent_ms += length_ms
        self.frames_sent += len(frames)
        self._actions.append(SendMedia(frames[0] if len(frames) == 1 else b"".join(frames)))
        step = self.mark_every_frames if response.marked_ms else self.first_mark_frames
        if self.uses_marks and response.sent_ms - response.marked_ms >= step * self.frame_ms:
            self._send_mark(response, response.sent_ms)
        self._maybe_final_mark(response)

    def _next_report_ms(self) -> int | None:
        """Without markers: the response position whose playing out is reported next (every marker interval,
        and the end of an ended response), or None."""
        current = self._current
        if current is None:
            return None
        reported = self._acked.get(current.response_id, 0)
        step = reported + self.mark_every_frames * self.frame_ms
        if step <= current.sent_ms:
            return step
        if current.ended and current.queued_frames == 0 and reported < current.sent_ms:
            return current.sent_ms
        return None

    def _report_heard(self, now_ms: int) -> None:
        target = self._next_report_ms()
        if target is not None and self._current is not None and self._heard_at(now_ms) >= target:
            self._note_heard(self._current.response_id, self._heard_at(now_ms))

    def _maybe_final_mark(self, response: _Response) -> None:
        if self._paused is not None:
            return  # after the held audio, at ``resume``
        if response.ended and not response.final_mark_sent and response.queued_frames == 0:
            response.final_mark_sent = True
            if self.uses_marks and response.sent_ms != response.marked_ms:
                self._send_mark(response, response.sent_ms)

    def _send_mark(self, response: _Response, ms: int) -> None:
        response.marked_ms = ms
        name = f"{response.response_id}{_MARK_SEPARATOR}{ms}"
        self._outstanding.append((name, response.response_id, ms))
        self._actions.append(SendMark(name))

    def _on_reached(self, response_id: str, ms: int, now_ms: int) -> None:
        if self._current is not None and self._current.response_id == response_id:
            # An echo comes after the audio played (never before): playback reached ``ms`` by ``now_ms``. Later
            # than the model: the carrier plays behind it. Earlier: an earlier echo was late on our side (the
            # bridge stalled reading it), and the model moves back rather than keep that stall for the call.
            predicted = self._time_of(ms)
            if predicted is not None:
                # against the send clock, before any correction; an early echo is no lag
                self.mark_lags_ms.append(max(0, now_ms - predicted + self._shifted_ms))
                if self.recorder is not None:
                    self.recorder.echoed(now_ms - predicted, now_ms)
                if now_ms != predicted:
                    self.corrections += 1
                    self._shift(now_ms - predicted)
                    moves = self._moves
                    if abs(now_ms - predicted) * 2 >= self.frame_ms:  # under half a frame: nothing a frame's judge sees
                        moves.append((now_ms, abs(now_ms - predicted)))
                    while moves and moves[0][0] < now_ms - _MOVES_KEPT_MS:
                        moves.popleft()
        self._note_heard(response_id, ms)

    def _note_heard(self, response_id: str, heard_ms: int) -> None:
        if heard_ms > self._acked.get(response_id, -1):
            self._acked[response_id] = heard_ms
            self._heard.append(HeardUpdate(response_id, heard_ms))

    def _clear_segments(self) -> None:
        self._segments.clear()
        self._played_runs.clear()
        self._played_floor_ms = 0
        self._shifted_ms = 0

    def _heard_at(self, now_ms: int) -> int:
        heard = self._played_floor_ms
        for segment in self._segments:
            if segment.start_ms >= now_ms:
                break
            heard = segment.from_ms + min(now_ms - segment.start_ms, segment.length_ms)
        return max(heard, self._acked.get(self._current.response_id, 0) if self._current else 0)

    def _time_of(self, ms: int) -> int | None:
        """Wall time at which the model says response audio position ``ms`` finishes playing."""
        for segment in self._segments:
            if segment.from_ms < ms <= segment.from_ms + segment.length_ms:
                return segment.start_ms + (ms - segment.from_ms)
        return None

    def _shift(self, delay_ms: int) -> None:
        self._shifted_ms += delay_ms
        for segment in self._segments:
            segment.start_ms += delay_ms
        self._buffer_end_ms += delay_ms
