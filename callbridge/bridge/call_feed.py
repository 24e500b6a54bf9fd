"""What the call's application gets of one stream, as an observer of the call's outputs: its events (``call.answered``,
turns, barge-ins, digits, silence, tools, transfers, ``call.ended``), its report across the call's streams, and the
stream's share of its recording; and, where the caller has a screen (the browser phone's page), the transcript as it
comes. The media driver (``bridge/media.py``) hands it what the call produced and moves no application plumbing
itself.

The report crosses streams through the registry: a stream that ends with the call still up hands it on (a note
the next stream, on any process, picks up); the stream that ends the call sends it, once its recording is uploaded
where the call's assistant asked for that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from structlog.stdlib import BoundLogger

from callbridge.application import CallContext
from callbridge.application.events import CallEvent, CallReport, EventType, MediaQuality
from callbridge.bridge.app_events import EventDelivery
from callbridge.bridge.call_outputs import Observed, StreamReport
from callbridge.bridge.call_report import REPORT_NOTE, CallReportBuilder
from callbridge.bridge.call_setup import CallSetup
from callbridge.bridge.carrier_transport import TranscriptTransport
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.pacing import monotonic_ms
from callbridge.bridge.recording import StereoRecorder
from callbridge.bridge.recording_store import CallRecording, RecordingStore, public_url
from callbridge.bridge.registry import CallRegistry, RegistryUnavailable
from callbridge.engine.events import EngineEvent, InputTranscript, TranscriptDelta
from callbridge.engine.port import DuplexSession

__all__ = ["CallFeed"]

_REPORT_KEPT_MS = 3_600_000
"""How long a call's report so far waits in the registry for its next stream."""


class CallFeed:
    """One stream's events, report and recording, for the call's application (see the module docstring)."""

    def __init__(
        self,
        events: EventDelivery | None,
        recordings: RecordingStore | None,
        registry: CallRegistry,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        log: BoundLogger,
        screen: TranscriptTransport | None = None,
    ) -> None:
        """``events``: the application's (None: it takes none); ``recordings``: where recordings go; ``registry``:
        where the report waits for the call's next stream; ``spawn``: work left to the background (an upload);
        ``screen``: where the caller sees the transcript as it comes (the browser phone's page), if anywhere."""
        self._events, self._recordings, self._registry, self._spawn = events, recordings, registry, spawn
        self._screen = screen
        self.log = log
        """``log``: the stream's, as bound once its session is (``bound``): nothing is said before."""
        self.report: CallReportBuilder | None = None
        """The call's report as this stream builds it (where an application takes events, or the console is on)."""
        self._setup: CallSetup | None = None
        """As the call's application set it up (None: no application did)."""
        self._context: CallContext | None = None
        """The call as its events name it: its setup's, or as its stream's start says."""
        self._recording: CallRecording | None = None
        self._stream_ended_at: float | None = None
        """When the stream ended (``time.time()``): the call's end, if it does not come back."""

    async def bound(
        self, call_id: str, setup: CallSetup | None, session: DuplexSession, log: BoundLogger, *, resumed: bool,
        context: Callable[[], CallContext],
    ) -> None:  # fmt: skip
        """The stream's session is bound (``log``: the stream's, with the call and the session): the call's report is
        the one its last stream handed on, or begun here (its first stream: ``call.answered``). Looked for on a
        stream with a new session too: the engine may have been lost mid-call. Nothing where nobody takes events
        (no application that does, no console). ``context``: the call as its stream's start says, where no
        application set the call up (``setup`` None)."""
        self.log = log
        if self._events is None:
            return
        self._setup = setup
        self._context = setup.context if setup is not None else context()
        kept = None
        try:
            kept = await self._registry.note(call_id, REPORT_NOTE)
        except RegistryUnavailable as exc:
            self.log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)
        self.report = report = CallReportBuilder.from_json(kept) if kept is not None else CallReportBuilder(started_at=time.time())
        report.streams += 1
        try:
            endpoint = session.resume_ticket().endpoint
        except Exception:  # a session gone this instant: where it was is not worth failing the stream for
            endpoint = None
        engine = public_url(endpoint) if endpoint else None
        report.bound(resumed, engine)
        if kept is None:
            self.emit("call.answered", engine=engine)
        else:
            self.emit("call.resumed", stream=report.streams, session="resumed" if resumed else "new", engine=engine)

    def emit(self, kind: EventType, **data: Any) -> None:
        """A call event to the application (``app_events``: queued, never waited for)."""
        events, report, context = self._events, self.report, self._context
        if events is None or report is None or context is None:
            return
        events.emit(context, CallEvent(type=kind, call_id=context.call_id, at=time.time(), seq=report.next_seq(), data=data))

    def engine_event(self, event: EngineEvent) -> None:
        """What the model said and heard, for the report's transcript and the caller's screen."""
        report, screen = self.report, self._screen
        if isinstance(event, TranscriptDelta):
            if report is not None:
                report.transcribed(event.response_id, event.delta)
            if screen is not None:
                screen.transcript("agent", event.delta, event.response_id)
        elif isinstance(event, InputTranscript):
            if report is not None:
                report.caller_said(event.item_id, event.transcript)
            if screen is not None:
                screen.transcript("caller", event.transcript, event.item_id)

    def observed(self, seen: Observed) -> None:
        if self.report is None:
            return
        self.report.observe(seen)
        match seen.kind:
            case "turn":
                self.emit("turn", latency_ms=seen.ms, response_id=seen.response_id)
            case "barge-in":
                self.emit("barge-in", heard_ms=seen.ms, generated_ms=seen.of_ms, response_id=seen.response_id, decided_by=seen.detail)
            case "dtmf":
                self.emit("dtmf", digit=seen.detail)
            case "silence":
                self.emit("silence", silent_ms=seen.ms, action=seen.detail)
            case "answered-by":
                answered_by, _, why = (seen.detail or "").partition(":")
                self.emit("call.machine_detected", answered_by=answered_by, why=why, after_ms=seen.ms, greeting_ms=seen.of_ms)
            case "voicemail-left":
                self.emit("call.voicemail_left")

    def tool_ran(self, name: str, *, ok: bool, elapsed_ms: float) -> None:
        if self.report is not None:
            self.report.tools += 1
        self.emit("tool", name=name, ok=ok, elapsed_ms=elapsed_ms)

    # ------------------------------------------------------------- recording

    def record_from(self, call_id: str, recorder: StereoRecorder | None) -> None:
        """The stream is recorded from its bind, where the call records and recordings are stored."""
        if recorder is not None and self._recordings is not None:
            self._recording = self._recordings.open(call_id, recorder.rate_hz)

    def record(self, chunk: bytes) -> None:
        if self._recording is not None and self._recordings is not None:
            self._recordings.write(self._recording, chunk)

    async def close_recording(self, recorder: StereoRecorder | None, now_ms: int) -> None:
        """The stream's last chunk of the recording written and the file closed; its path goes in the report."""
        recording, store = self._recording, self._recordings
        if recording is None or recorder is None or store is None:
            return
        path = await store.close(recording, recorder.take(now_ms, final=True))
        if path is None:
            self.log.warning("recording_not_written", reason=recording.failed or "nothing to write")
            return
        self.log.info("recording_written", path=str(path), stream_ms=recorder.duration_ms, dropped_chunks=recording.dropped_chunks)
        if self.report is not None:
            self.report.recording = str(path)

    # ------------------------------------------------------------------- end

    def measured(self, media: MediaQuality) -> None:
        """The stream's line, as its transport measured it (SIP's RTP): the report's ``media``."""
        if self.report is not None:
            self.report.media = media.model_dump(mode="json")

    async def stream_ended(self, call_id: str, report: StreamReport, session_id: str | None) -> None:
        """The stream ends: the call's report goes to the application (``call.ended``) where the call is over, else
        on to the call's next stream (the registry's note, written before the session is parked for it)."""
        builder = self.report
        if builder is None or self._context is None:
            return
        builder.agent_audio_ms += report.output_ms
        if builder.first_agent_audio_ms is None:  # the call's first stream's (its answer's)
            builder.first_agent_audio_ms = report.first_agent_audio_ms
        builder.barge_in_echo_ms += report.barge_in_echo_ms
        # the stream's end as its media says: a carrier whose hang-up comes by a webhook before its socket closes
        # had the webhook's handling counted in the call's length (9,392 ms reported for 9,010 on a loaded
        # machine); no later than now (media read ahead of the clock)
        behind_s = 0.0 if report.media_until_ms is None else max(0, monotonic_ms() - report.media_until_ms) / 1000
        self._stream_ended_at = time.time() - behind_s
        if report.facts.call_over:
            self.call_over(report.facts.end_reason or EndCause(EndReason.UNKNOWN, "unknown"), session_id)
            return
        try:
            await self._registry.keep_note(call_id, REPORT_NOTE, builder.to_json(), _REPORT_KEPT_MS)
        except RegistryUnavailable as exc:
            self.log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)

    def call_over(self, end_reason: EndCause, session_id: str | None) -> None:
        """The call is over: its report goes to the application (``call.ended``), once its recording is uploaded where
        its assistant asked for that. Its end is when its last stream ended."""
        builder, context = self.report, self._context
        if builder is None or context is None:
            return
        assistant = self._setup.assistant if self._setup is not None else None
        call_report = builder.report(
            context, ended_at=self._stream_ended_at or time.time(), end_reason=end_reason,
            engine_session_id=session_id, metadata=assistant.metadata if assistant is not None else None,
        )  # fmt: skip
        upload_to = assistant.recording_upload_url if assistant is not None else None
        if upload_to is not None and builder.recording is not None and self._recordings is not None:
            # the report waits for the upload (it names where the recording went), the stream does not
            self._spawn(self._upload_then_report(Path(builder.recording), str(upload_to), call_report))
        else:
            self.emit("call.ended", report=call_report.model_dump(mode="json"))

    async def _upload_then_report(self, path: Path, url: str, call_report: CallReport) -> None:
        assert self._recordings is not None
        uploaded = await self._recordings.upload(path, url, call_report.call.call_id)
        if uploaded:
            call_report = call_report.model_copy(update={"recording": public_url(url)})
        self.emit("call.ended", report=call_report.model_dump(mode="json"))
