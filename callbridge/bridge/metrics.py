"""A bridge process's Prometheus metrics: the counters and histograms its calls and carriers update, and the level
gauges read at scrape time (``BridgeMetrics.watch``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sized
from typing import Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from callbridge.application.events import MediaQuality
from callbridge.bridge.registry import CallRegistry
from callbridge.engine.port import DuplexEngine

__all__ = ["BridgeMetrics", "Watched"]


class Watched(Protocol):
    """What the level gauges read (``BridgeServices``)."""

    @property
    def live_streams(self) -> Sized: ...
    @property
    def background(self) -> Sized: ...
    @property
    def answer_sessions(self) -> Sized | None: ...
    @property
    def registry(self) -> CallRegistry: ...
    @property
    def engine(self) -> DuplexEngine: ...


class BridgeMetrics:
    """Prometheus metrics of one bridge process, in its own registry."""

    def __init__(
        self, registry: CollectorRegistry, *, memory_registry: bool = True, local_engine: bool = True, group_registry: bool = False
    ) -> None:
        """``memory_registry``, ``local_engine``: the process's registry is its own (not Redis), its engine the
        embedded one. A level gauge that only they can answer does not exist otherwise (it would read a constant 0
        there, which is not the truth): the registry's detached sessions and entries, the engine's sessions.
        ``group_registry``: the registry is a ``serve --workers`` group's, in memory in its supervisor: every worker
        reports the group's entries and detached sessions (the largest is exported, not the sum), and the sessions
        held (this worker's streams and the group's detached ones) are not exported."""
        self._count_calls(registry)
        self._count_sip_and_engine(registry)
        self._count_carrier_and_application(registry)
        self._watch_levels(registry, memory_registry=memory_registry, local_engine=local_engine, group_registry=group_registry)

    def _count_calls(self, registry: CollectorRegistry) -> None:
        """Streams, their audio, barge-in and the carriers' REST hang-ups."""
        # ``multiprocess_mode``: how a gauge adds up over ``--workers`` processes (``group_metrics``); else unused
        self.calls_active = Gauge(
            "callbridge_calls_active", "Calls with a live media stream", ["provider"], registry=registry, multiprocess_mode="livesum"
        )
        self.calls_total = Counter("callbridge_calls_total", "Media streams ended, by how", ["provider", "end"], registry=registry)
        self.protocol_errors = Counter(
            "callbridge_carrier_protocol_errors_total", "Calls ended by invalid carrier input", ["provider", "reason"], registry=registry
        )
        self.stream_refused = Counter("callbridge_streams_refused_total", "Media streams not bridged", ["provider", "reason"], registry=registry)
        self.engine_sessions = Counter(
            "callbridge_engine_sessions_total", "Engine sessions bound to streams", ["how"], registry=registry
        )
        self.hangups = Counter("callbridge_hangups_total", "Hang-ups through carrier REST APIs", ["provider", "result"], registry=registry)
        self.stream_status = Counter(
            "callbridge_stream_status_total", "Carrier stream status callbacks", ["provider", "event"], registry=registry
        )
        self.audio_seconds = Counter(
            "callbridge_audio_seconds_total", "Audio bridged, counted as each stream ends", ["provider", "direction"],
            registry=registry,
        )  # fmt: skip
        self.frames_flushed = Counter(
            "callbridge_frames_flushed_total", "Agent frames dropped unsent by barge-in flushes", ["provider"], registry=registry
        )
        self.barge_ins = Counter("callbridge_barge_ins_total", "Barge-in flushes", ["provider"], registry=registry)
        self.barge_in_pauses = Counter(
            "callbridge_barge_in_pauses_total", "Bridge-mode barge-in: the agent paused for the caller's speech, by how it ended",
            ["provider", "outcome"], registry=registry,
        )  # fmt: skip
        self.barge_in_echo_seconds = Counter(
            "callbridge_barge_in_echo_seconds_total",
            "Bridge-mode barge-in: the caller's line that was only the agent's own echo, sent to the engine as silence",
            ["provider"], registry=registry,
        )  # fmt: skip
        self.late_audio_dropped = Counter(
            "callbridge_late_audio_dropped_total", "Engine audio deltas of an interrupted response, dropped", ["provider"],
            registry=registry,
        )  # fmt: skip
        self.engine_errors = Counter("callbridge_engine_errors_total", "Engine error events, by code", ["code"], registry=registry)

    def _count_sip_lines(self, registry: CollectorRegistry) -> None:
        """Each SIP call's line as it ended (``CallReport.media``), by codec."""
        self.sip_call_mos = Histogram(
            "callbridge_sip_call_mos", "SIP calls' E-model MOS estimate of their line at the end (1-4.5)", ["codec"],
            buckets=(1.5, 2.0, 2.5, 3.0, 3.3, 3.6, 3.9, 4.1, 4.3, 4.5), registry=registry,
        )  # fmt: skip
        self.sip_call_jitter_seconds = Histogram(
            "callbridge_sip_call_jitter_seconds", "SIP calls' interarrival jitter of the caller's RTP at the end (RFC 3550)",
            ["codec"], buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32), registry=registry,
        )  # fmt: skip
        self.sip_call_loss_ratio = Histogram(
            "callbridge_sip_call_loss_ratio", "SIP calls' share of the caller's RTP packets lost or too late", ["codec"],
            buckets=(0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5), registry=registry,
        )  # fmt: skip
        self.sip_call_round_trip_seconds = Histogram(
            "callbridge_sip_call_round_trip_seconds", "SIP calls' last round trip their peer's RTCP showed (calls with one)",
            ["codec"], buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0), registry=registry,
        )  # fmt: skip

    def observe_line(self, media: MediaQuality) -> None:
        """A SIP call's line as it ended."""
        self.sip_call_mos.labels(media.codec).observe(media.mos)
        self.sip_call_jitter_seconds.labels(media.codec).observe(media.jitter_ms / 1000)
        self.sip_call_loss_ratio.labels(media.codec).observe(media.loss_percent / 100)
        if media.round_trip_ms is not None:
            self.sip_call_round_trip_seconds.labels(media.codec).observe(media.round_trip_ms / 1000)

    def _count_sip_and_engine(self, registry: CollectorRegistry) -> None:
        """SIP's drops and registrations, the event loop, the engine's failures, the playout model's corrections."""
        self.sip_dropped = Counter(
            "callbridge_sip_dropped_total",
            "SIP datagrams and RTP packets dropped unanswered (garbage, strays, unexpected sources, late), by reason",
            ["reason"], registry=registry,
        )  # fmt: skip
        self.sip_registration_state = Gauge(
            "callbridge_sip_registration_state", "1 for each SIP registration's current state (sip.registrations)",
            ["registration", "state"], registry=registry,
        )  # fmt: skip
        self.sip_registration_failures = Counter(
            "callbridge_sip_registration_failures_total", "REGISTERs that ended without a binding, by reason",
            ["registration", "reason"], registry=registry,
        )  # fmt: skip
        self._count_sip_lines(registry)
        self.event_loop_lag_seconds = Histogram(
            "callbridge_event_loop_lag_seconds",
            "How late the event loop runs a timer (sampled twice a second): every call's pacing waits on it",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 10.0, 30.0),
            registry=registry,
        )
        self.engine_failures = Counter(
            "callbridge_engine_failures_total",
            "Calls whose engine session failed mid-call (failure tone, then hang-up), by why (connection_failed: the "
            "server could not be reached within engine.reconnect_budget_s)",
            ["provider", "reason"], registry=registry,
        )  # fmt: skip
        self.call_actions = Counter(
            "callbridge_call_actions_total", "Carrier actions the agent asked for (transfer, DTMF), by result",
            ["provider", "action", "result"], registry=registry,
        )  # fmt: skip
        self.heard_corrections = Counter(
            "callbridge_heard_corrections_total", "Marker echoes that moved a call's playback model off the send clock",
            ["provider"], registry=registry,
        )  # fmt: skip
        self.playout_underruns = Counter(
            "callbridge_playout_underruns_total", "Agent audio that reached the carrier after its buffer ran dry mid-response",
            ["provider"], registry=registry,
        )  # fmt: skip
        self.mark_lag_seconds = Histogram(
            "callbridge_mark_lag_seconds",
            "Marker echo arrival after the moment its audio would have played, had the carrier played it as sent",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
            registry=registry,
        )
        self.message_seconds = Histogram(
            "callbridge_carrier_message_seconds",
            "Handling one inbound carrier message, sampled one in 50: parse, decode, resample, engine, what it sends",
            buckets=(0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05),
            registry=registry,
        )
        self.turn_latency_seconds = Histogram(
            "callbridge_turn_latency_seconds",
            "A turn: the caller stopped speaking → the agent's reply on its way to the caller (the end-of-turn silence "
            "the engine waits for is in it)",
            ["provider"], buckets=(0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0), registry=registry,
        )  # fmt: skip
        self.first_audio_seconds = Histogram(
            "callbridge_first_audio_to_engine_seconds",
            "A stream's first caller audio: read from the carrier to handed to the engine session (the engine's "
            "open or resume overlaps the reading; audio read before it is bound waits for it)",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )

    def _count_carrier_and_application(self, registry: CollectorRegistry) -> None:
        """Carrier messages, DTMF, webhooks, the application's requests and events, recordings, admission, CPU."""
        self.unknown_events = Counter(
            "callbridge_unknown_events_total", "Carrier messages of an event type no codec here knows, ignored (the call goes on)",
            ["provider", "event"], registry=registry,
        )  # fmt: skip
        self.dtmf_received = Counter(
            "callbridge_dtmf_received_total", "Digits the caller pressed (RFC 4733, SIP INFO, carriers' dtmf events)", ["provider"],
            registry=registry,
        )  # fmt: skip
        self.webhook_replay_checks = Counter(
            "callbridge_webhook_replay_checks_total",
            "Signed webhooks checked for a replay: first (taken), replayed (refused 403), unchecked (registry away: taken)",
            ["provider", "result"], registry=registry,
        )  # fmt: skip
        self.assistant_requests = Counter(
            "callbridge_assistant_requests_total",
            "Assistant requests to the application, by outcome (application, fallback, rejected) and failure",
            ["outcome", "failure"], registry=registry,
        )  # fmt: skip
        self.app_events = Counter(
            "callbridge_app_events_total", "Call events to the application, by type and outcome (delivered, dropped_…)",
            ["type", "outcome"], registry=registry,
        )  # fmt: skip
        self.console_events = Counter(
            "callbridge_console_events_total", "Call events written to the console's journal in the registry, or dropped (…_queue_full, …_registry_unavailable, …_error)",
            ["outcome"], registry=registry,
        )  # fmt: skip
        self.recordings = Counter(
            "callbridge_recordings_total",
            "Call recordings: streams written, chunks dropped (the disk behind), writes failed, uploads and their failures",
            ["outcome"], registry=registry,
        )  # fmt: skip
        self.admission_refused = Counter(
            "callbridge_admission_refused_total", "New calls refused by admission control, by limit", ["reason"], registry=registry
        )
        self.cpu_utilization = Gauge(
            "callbridge_cpu_utilization", "The process's CPU use as a share of one core, smoothed over 5 s", registry=registry,
            multiprocess_mode="liveall",  # admission's budget is per process: one series per worker (``pid``)
        )
        self.barge_in_clear_seconds = Histogram(
            "callbridge_barge_in_clear_seconds",
            "Engine interruption signal to carrier flush sent",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1),
            registry=registry,
        )

    def _watch_levels(self, registry: CollectorRegistry, *, memory_registry: bool, local_engine: bool, group_registry: bool) -> None:
        """The level gauges (``__init__`` says which exist)."""
        # What the process holds, read at scrape time (``watch``): a leak shows as a level that never comes back.
        # With ``--workers``, each worker copies them into its files every second (``group_metrics``): summed, but
        # for the group registry's counts, which every worker reports alike (the largest is read).
        self.live_streams = Gauge("callbridge_live_streams", "Media streams bound to an engine session here", registry=registry, multiprocess_mode="livesum")
        registry_mode: Literal["livesum", "livemax"] = "livemax" if group_registry else "livesum"

        def level(name: str, documentation: str, known: bool, mode: Literal["livesum", "livemax"] = "livesum") -> Gauge | None:
            """A level this process can tell (``known``), else None: not even created, since with ``--workers``
            a gauge created has its file, and would be exported reading 0."""
            return Gauge(name, documentation, registry=registry, multiprocess_mode=mode) if known else None

        self.detached_sessions = level(
            "callbridge_detached_sessions", "Engine sessions detached, waiting for their call's next stream (memory registry)",
            memory_registry, registry_mode,
        )  # fmt: skip
        self.engine_sessions_open = level(
            "callbridge_engine_sessions_open", "Engine sessions the bridge holds: live streams + detached (memory registry)",
            memory_registry and not group_registry,
        )  # fmt: skip
        self.registry_entries = level(
            "callbridge_registry_entries", "Calls the memory registry holds (live, detached, or recently ended)", memory_registry,
            registry_mode,
        )  # fmt: skip
        self.local_engine_sessions = level(
            "callbridge_local_engine_sessions", "Sessions the embedded engine holds (open or in their disconnect grace)", local_engine
        )
        self.background_tasks = Gauge(
            "callbridge_background_tasks", "Tasks that outlive their stream (closing sessions nobody came back for)", registry=registry,
            multiprocess_mode="livesum",
        )
        self.asyncio_tasks = Gauge("callbridge_asyncio_tasks", "Tasks on the event loop", registry=registry, multiprocess_mode="livesum")
        self.answer_sessions = Gauge(
            "callbridge_answer_sessions", "Engine sessions opened at an answer webhook that no stream has taken yet",
            registry=registry, multiprocess_mode="livesum",
        )  # fmt: skip
        self.levels = tuple(
            gauge for gauge in (
                self.live_streams, self.detached_sessions, self.engine_sessions_open, self.registry_entries,
                self.local_engine_sessions, self.background_tasks, self.asyncio_tasks, self.answer_sessions,
            ) if gauge is not None
        )  # fmt: skip
        """The gauges read at scrape time (``watch``), those exported here."""

    def watch(self, bridge: Watched, loop: asyncio.AbstractEventLoop) -> None:
        """Point the level gauges at ``bridge`` and ``loop``: each is computed when ``/metrics`` is scraped,
        nothing per frame. Gauges the registry or engine cannot answer (Redis, a remote engine: their counts are
        None) do not exist (``__init__``)."""
        self.live_streams.set_function(lambda: len(bridge.live_streams))
        self.background_tasks.set_function(lambda: len(bridge.background))
        self.asyncio_tasks.set_function(lambda: len(asyncio.all_tasks(loop)))
        answering = bridge.answer_sessions
        self.answer_sessions.set_function(lambda: len(answering) if answering is not None else 0)
        registry = bridge.registry
        if self.detached_sessions is not None:
            self.detached_sessions.set_function(lambda: registry.detached_count or 0)
        if self.engine_sessions_open is not None:
            self.engine_sessions_open.set_function(
                lambda: len(bridge.live_streams) + (registry.detached_count or 0) + (len(answering) if answering is not None else 0)
            )
        if self.registry_entries is not None:
            self.registry_entries.set_function(lambda: registry.entry_count or 0)
        engine = bridge.engine
        if self.local_engine_sessions is not None:  # the embedded engine (``LocalEngine``)
            self.local_engine_sessions.set_function(lambda: float(engine.session_count or 0))
