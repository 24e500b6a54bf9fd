"""The agent's speech on one stream, sans-I/O: its replies' audio out to the carrier, and what the caller heard of it.

The reply's audio (``AgentAudio``: resampled, encoded, framed) goes into the ``PlayoutLedger`` (paced, bounded lead,
markers); the ledger's frames, markers and clears go to the carrier (over its ``CarrierLink``), what it learns was heard (marker
echoes) to the engine — an ack, or a truncation where the caller cut the reply off (``HeardAccount``: never less than
the engine was told, over the whole call). Barge-in is ``interrupt``: the carrier's buffer flushed, the engine told
what was heard, the reply's late audio dropped. A stream that drops leaves the rest of the reply unheard
(``unheard_at_drop``) for the next stream, which plays it first (``play_unheard``).

``CallSession`` composes it: it decides when (the call's state); this part does the audio and the account. Its outputs
go into the call's one queue, in the order produced.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Final, Protocol

from callbridge.bridge.agent_audio import AgentAudio
from callbridge.bridge.binding import EngineBinding
from callbridge.bridge.call_options import CallOptions
from callbridge.bridge.call_outputs import BargeInFlushed, CallOutput, MarkLag, Observed, ToCarrier, ToEngine
from callbridge.bridge.carrier_link import CarrierLink
from callbridge.bridge.echo_gate import level_db
from callbridge.bridge.heard import HeardAccount
from callbridge.bridge.playout import PlayoutLedger
from callbridge.carriers.base import DEFAULT_PROFILE, CarrierProfile
from callbridge.codecs import AudioEncoding, decode_to_pcm16
from callbridge.engine.events import (
    AudioDelta,
    Capabilities,
    EngineEvent,
    ItemTruncated,
    OutputAudioCleared,
    OverlapDecision,
    PlaybackAcknowledged,
    ResponseDone,
)
from callbridge.engine.late_audio import LateAudioFilter
from callbridge.engine.port import UNHEARD_KEPT_BYTES, UnheardAudio

__all__ = ["FIRST_MARK_FRAMES", "AgentSpeech", "ReplyListener", "ledger_for"]

FIRST_MARK_FRAMES: Final = 5
"""A response's first marker goes this many 20 ms frames in: its echo pins where the carrier started playing the
response (the network's and the carrier's delay), so the heard position is exact from then on; later markers, every
``mark_every_frames``, only correct it for drift."""
_FALLBACK_RESPONSE: Final = "engine_failure"


def ledger_for(options: CallOptions, profile: CarrierProfile) -> PlayoutLedger:
    """The playout ledger for the carrier's way of playing (known once its stream has started)."""
    frame_ms = profile.frame_ms
    lead_ms = max(profile.lead_ms if profile.lead_ms is not None else options.lead_ms, frame_ms)
    return PlayoutLedger(
        frame_ms=frame_ms,
        lead_ms=lead_ms,
        mark_every_frames=max(1, options.mark_every_frames * 20 // frame_ms),
        first_mark_frames=max(1, min(FIRST_MARK_FRAMES, options.mark_every_frames) * 20 // frame_ms),
        frames_per_message=max(1, min(options.media_message_ms, lead_ms) // frame_ms) if profile.joins_frames else 1,
        uses_marks=options.uses_marks and profile.uses_marks,
        marks_echoed_on_clear=profile.marks_echoed_on_clear,
        flushes=profile.flushes,
    )


class ReplyListener(Protocol):
    """Who hears of the agent's replies beginning and being cut off (the agent's turns)."""

    def reply_began(self, response_id: str, now_ms: int) -> None: ...

    def reply_cancelled(self) -> None: ...


class AgentSpeech:
    """The agent's replies played to the caller on one stream, and what the caller heard of them. See the module
    docstring."""

    __slots__ = (
        "options", "ledger", "audio", "heard", "_late", "late_deltas_dropped", "flushes", "pauses", "resumes", "echo_ms", "capabilities", "_out",
        "_link", "bound_at_ms",
    )  # fmt: skip

    def __init__(self, options: CallOptions, out: list[CallOutput], link: CarrierLink) -> None:
        self.options = options
        self.ledger = ledger_for(options, DEFAULT_PROFILE)
        self.audio = AgentAudio(options.resampler_quality)
        """The reply arriving, resampled, encoded and framed (``bridge/agent_audio.py``)."""
        self.heard = HeardAccount()
        """What the caller heard of each recent response over the call, and what the engine was told of it."""
        self._late = LateAudioFilter()
        self.late_deltas_dropped = 0
        self.flushes = 0
        """Barge-in flushes so far (the driver times them)."""
        self.pauses = self.resumes = self.echo_ms = 0
        """Bridge-mode barge-in: the agent paused for the caller's speech, and those pauses that resumed; how much of
        the caller's line was only the agent's own echo (sound the engine's VAD would have heard, sent as silence)."""
        self.capabilities = Capabilities()
        self._out = out
        self._link = link
        """The carrier's connection: what the ledger plays goes out through it."""
        self.bound_at_ms: int | None = None
        """When the engine session was bound (the call answered, as far as the stream knows)."""

    def start(self, profile: CarrierProfile, encoding: AudioEncoding, rate_hz: int) -> None:
        """The stream started: the agent's audio goes out in ``encoding`` at ``rate_hz``, played the carrier's way."""
        self.ledger = ledger_for(self.options, profile)
        self.audio.start(encoding, rate_hz, self.ledger.frame_ms)

    def bound(self, binding: EngineBinding, now_ms: int, *, hold_tells_ms: int) -> None:
        """The engine session is bound: what a resumed call's earlier streams left of the account."""
        self.bound_at_ms = now_ms
        if binding.taken_over:
            self.heard.hold_tells_until(now_ms + hold_tells_ms)
        self.capabilities = binding.capabilities
        for response_id, ms in binding.heard_ms:
            self.heard.cut(response_id, ms)
        for response_id, ms in binding.told_ms:
            self.heard.note_told(response_id, ms)

    def play_unheard(self, unheard: UnheardAudio, now_ms: int) -> None:
        """The last stream's unheard rest of a reply, first: its frames as they were, when this stream carries the
        same audio; its later audio (if the engine was still generating it) follows on the same response."""
        response_id = unheard.response_id
        if not self.audio.carries(unheard):
            heard = self.heard.heard_before(response_id)
            if unheard.ended and heard > 0:
                self.tell(response_id, heard, truncate=True)
            return
        frames = self.audio.unheard_frames(unheard, base64.b64decode(unheard.audio))
        self.ledger.enqueue(response_id, frames, now_ms)
        self.heard.generated(response_id, unheard.generated_ms)
        if unheard.ended:
            self.ledger.end_response(response_id, now_ms)
        else:  # its later audio continues the same frames (``take``)
            self.audio.continue_unheard(response_id)

    # ---------------------------------------------------------------- replies

    def on_event(self, event: EngineEvent, now_ms: int, listener: ReplyListener) -> bool:
        """An engine event of the agent's speech (its audio, its end, a barge-in) or of what was heard of it. False:
        not one of those."""
        match event:
            case AudioDelta():
                self.take(event, now_ms, listener.reply_began)
            case ResponseDone(response_id, status, _, _):
                if status == "cancelled":
                    self.interrupt(response_id, now_ms)
                    listener.reply_cancelled()
                elif response_id == self.audio.response_id:
                    self.finish_reply(now_ms)
            case OverlapDecision(action, _, _) if action == "barge_in":
                self.interrupt(self.audio.response_id, now_ms)
            case OutputAudioCleared(response_id):
                self.interrupt(response_id or self.audio.response_id, now_ms)
            case PlaybackAcknowledged(response_id, played_ms) if response_id is not None:
                self.heard.note_told(response_id, played_ms)
            case ItemTruncated(item_id, audio_end_ms):
                self.heard.engine_truncated(item_id.removeprefix("item_"), audio_end_ms)
            case _:
                return False
        return True

    def admits(self, event: EngineEvent) -> bool:
        """Whether the engine's ``event`` is for now, not audio of a cancelled response or an older epoch (counted)."""
        if self._late.admit(event):
            return True
        self.late_deltas_dropped += 1
        return False

    def take(self, delta: AudioDelta, now_ms: int, reply_began: Callable[[str, int], None]) -> None:
        """A delta of a reply's audio: framed and queued to play. A new reply first finishes the one before and calls
        ``reply_began``; a flushed reply's late audio is dropped."""
        audio, response_id = self.audio, delta.response_id
        if response_id in audio.interrupted:
            self.late_deltas_dropped += 1
            return
        if response_id != audio.response_id or not audio.converting:
            if audio.response_id is not None and audio.response_id != response_id:
                self.finish_reply(now_ms)
            audio.begin(response_id, delta.rate_hz)
            reply_began(response_id, now_ms)
            self.heard.response_began()
        self.heard.generated(response_id, len(delta.pcm) * 500 / delta.rate_hz)
        self._enqueue(response_id, audio.frames(delta.pcm), now_ms)

    def _enqueue(self, response_id: str, frames: list[bytes] | None, now_ms: int) -> None:
        if frames is not None:
            self.ledger.enqueue(response_id, frames, now_ms)
        self.drain()

    def finish_reply(self, now_ms: int) -> None:
        """The reply's audio is complete: drain the resampler, pad the last frame, mark its end."""
        audio, response_id = self.audio, self.audio.response_id
        if response_id is None:
            return
        if not audio.converting:  # only the last stream's rest played here
            self.ledger.end_response(response_id, now_ms)
            audio.stop()
            self.drain()
            return
        held, tail = audio.finish()
        self._enqueue(response_id, held, now_ms)
        if tail is not None:
            self.ledger.enqueue(response_id, [tail], now_ms)
        self.ledger.end_response(response_id, now_ms)
        self.drain()

    def responding(self, now_ms: int) -> bool:
        """A reply is arriving or playing."""
        return self.audio.response_id is not None or self.ledger.is_playing(now_ms)

    def told_all(self, response_id: str | None) -> bool:
        """The engine was told the caller heard all of ``response_id`` (to within a frame); None: no reply yet."""
        heard = self.heard
        return response_id is None or heard.told(response_id) >= int(heard.generated_ms(response_id) or 0.0) - self.ledger.frame_ms

    # --------------------------------------------------------------- barge-in

    def interrupt(self, response_id: str | None, now_ms: int) -> None:
        """Barge-in: stop the agent's audio at the carrier, tell the engine what was heard."""
        audio = self.audio
        if response_id is None or response_id in audio.interrupted:
            return
        audio.interrupted.add(response_id)
        if response_id == audio.response_id:
            audio.stop()
        self.stop_playback(response_id, now_ms)

    def stop_playback(self, response_id: str | None, now_ms: int, *, barge_in: bool = True) -> None:
        """Flush the ledger (the carrier's clear), ack what was heard and cut the model's turn to it — clamped
        to [0, sent], skipped before any audio — if the response playing is ``response_id`` (None: any).
        ``barge_in``: the caller's doing (counted and timed as a barge-in; decided by the bridge where it had paused
        the reply first, else by the engine)."""
        decided_by = "bridge" if self.ledger.paused else "engine"
        result = self.ledger.flush(now_ms)
        self.drain_to_carrier()  # the carrier's clear
        if barge_in:
            self.flushes += 1
            self._out.append(BargeInFlushed(result.response_id))
        self.drain_heard()
        if result.response_id is None or response_id not in (None, result.response_id):
            return
        heard = self.heard.on_call(result.response_id, max(0, min(result.heard_ms, result.sent_ms)))
        if heard > 0:
            self.tell(result.response_id, heard, truncate=True)
        if barge_in:
            generated = self.heard.generated_ms(result.response_id)
            generated_ms = round(generated) if generated is not None else None
            self._out.append(Observed("barge-in", heard, generated_ms, result.response_id, decided_by))

    def pause(self, now_ms: int) -> bool:
        """Bridge-mode barge-in's pause (#41): the carrier's buffer cleared, the reply held (``PlayoutLedger.pause``),
        the engine told what was heard so far. False: nothing was playing."""
        paused = self.ledger.pause(now_ms)
        if paused is None:
            return False
        self.pauses += 1
        self._out.append(Observed("barge-in-pause", paused.heard_ms, None, paused.response_id))
        self.drain()
        return True

    def resume(self, now_ms: int) -> None:
        """The pause was no interruption: the reply plays on from where the caller stopped hearing it."""
        if self.ledger.paused:
            self.resumes += 1
            self._out.append(Observed("barge-in-resume"))
        self.ledger.resume(now_ms)
        self.drain()

    @property
    def first_audio_after_ms(self) -> int | None:
        """The bind → the first audio sent to the caller (the agent's, or the failure tone where the engine failed
        first); None: none was sent."""
        first, bound = self.ledger.first_sent_ms, self.bound_at_ms
        return None if first is None or bound is None else max(0, first - bound)

    def with_mark_lags(self, out: list[CallOutput]) -> list[CallOutput]:
        """``out`` and, after it, each marker echo's lag since the last time (``MarkLag``: every few frames)."""
        lags = self.ledger.mark_lags_ms
        if lags:
            out.extend(MarkLag(lag_ms) for lag_ms in lags)
            lags.clear()
        return out

    def playing_level_db(self, at_ms: int) -> float:
        """How loud the agent is in the frame the caller hears at ``at_ms`` (now, or a moment ago;
        ``echo_gate.level_db``; 0: silence)."""
        frame = self.ledger.playing_frame(at_ms)
        return level_db(bytes(decode_to_pcm16(self.audio.encoding, frame))) if frame else 0.0

    def playing_moved_ms(self, since_ms: int) -> int:
        """How far the carrier's word moved the model of what the caller hears since ``since_ms`` (``moved_ms``)."""
        return self.ledger.moved_ms(since_ms)

    def silence(self, now_ms: int) -> None:
        """The engine is gone: what is queued goes, and nobody is told what was heard."""
        self.ledger.flush(now_ms)
        self.ledger.heard_updates()

    def play_tone(self, ms: int, now_ms: int) -> None:
        """No more of the agent: the fallback tone, ``ms`` long (0: none), and the carrier's part of what is queued."""
        self.audio.stop()
        if ms > 0:
            self.ledger.enqueue(_FALLBACK_RESPONSE, self.audio.tone(ms), now_ms)
            self.ledger.end_response(_FALLBACK_RESPONSE, now_ms)
        self.drain(to_engine=False)

    # ------------------------------------------------------------ the account

    def drain(self, *, to_engine: bool = True) -> None:
        """The ledger's frames, markers and clears to the carrier first (a clear is the most urgent thing there
        is), then what was heard to the engine."""
        self.drain_to_carrier()
        self.drain_heard(to_engine=to_engine)

    def drain_to_carrier(self) -> None:
        link = self._link
        send = link.codec.send  # every action through the codec (its sequence numbers), sent only while it listens
        for action in self.ledger.actions_to_send():
            message = send(action)
            if message is not None and link.send_failed_at_ms is None:
                self._out.append(ToCarrier(message))

    def drain_heard(self, *, to_engine: bool = True) -> None:
        updates = self.ledger.heard_updates()
        if not to_engine:
            return  # nobody to tell (the session is gone)
        for update in updates:
            self.tell(update.response_id, self.heard.on_call(update.response_id, update.heard_ms), truncate=False)

    def tell(self, response_id: str, heard_ms: int, *, truncate: bool) -> None:
        """Tell the engine the caller heard ``heard_ms`` of ``response_id``: an ack, or a truncation there (where
        the engine can truncate); never less than it was told before. Held while a takeover's replay comes in
        (``TAKEOVER_TELLS_HELD_MS``)."""
        command = self.heard.tell(response_id, heard_ms, truncate=truncate and self.capabilities.supports_audio_truncate)
        if command is not None:
            self._out.append(ToEngine(command))

    def release_held_tells(self) -> None:
        """A takeover's replay is in: tell the engine what was held back, where it was not told as much already."""
        for command in self.heard.release_held():
            self._out.append(ToEngine(command))

    def unheard_at_drop(self, now_ms: int) -> UnheardAudio | None:
        """The stream drops: the engine is told what was heard (ack, truncate), as for a barge-in. Returned: the
        rest of the reply the caller had not heard, where it is short enough for the next stream to play first
        (what the carrier held and what was still queued here); the engine goes on with what it still generates."""
        ledger, heard = self.ledger, self.heard
        unplayed = ledger.unplayed(now_ms)
        if unplayed is not None and sum(map(len, unplayed.frames)) <= UNHEARD_KEPT_BYTES:  # no truncation
            cut = unplayed.response_id
            ledger.flush(now_ms)
            self.drain()  # the ack of what was heard
            heard.cut(cut, heard.on_call(cut, unplayed.from_ms))
            frames_ms = len(unplayed.frames) * ledger.frame_ms
            generated = heard.generated_ms(cut)  # the frames' last one is padded: no more than was generated
            generated_ms = frames_ms if generated is None else min(frames_ms, int(generated) - unplayed.from_ms)
            audio = base64.b64encode(b"".join(unplayed.frames)).decode()
            encoding = (self.audio.encoding.value, self.audio.rate_hz, ledger.frame_ms)
            return UnheardAudio(cut, *encoding, audio, unplayed.ended, generated_ms)
        if self.audio.response_id is not None:  # still being generated: the next stream plays the rest
            cut = self.audio.response_id
            ledger.flush(now_ms)
            self.drain()  # the ack of what was heard; no truncation: the reply goes on
            heard.cut(cut, heard.on_call(cut, ledger.heard_ms(cut, now_ms)))
        elif ledger.is_playing(now_ms):  # complete: nothing more of it will come, cut it here
            self.stop_playback(None, now_ms, barge_in=False)
        return None

    def heard_so_far(self, now_ms: int, *, live: bool) -> tuple[tuple[str, int], ...]:
        """The cut-off replies (``HeardAccount.cut_replies``) and, on a ``live`` stream, the reply still being
        generated, with what the caller has heard of it so far."""
        playing = self.audio.response_id
        if live and playing is not None:
            return self.heard.with_playing(playing, self.heard.on_call(playing, self.ledger.heard_ms(playing, now_ms)))
        return self.heard.cut_replies
