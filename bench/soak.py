"""Soak: N simulated calls, call after call, for M minutes against ``callbridge serve`` in its own process, with
socket drops, barge-ins and key presses injected; then: did the bridge give everything back, and lose nothing?

The server runs the embedded engine and the ``echo`` agent, for every carrier named at once (the env
``callbridge loadtest --print-env`` gives each simulated account, as in ``bench/loadtest_carriers.py``). Each of
``--calls`` lanes places one call at a time through ``callbridge.sim.loadtest.LoadTest`` (the carrier's real answer
flow, wire and reconnect flow), of a random length in ``--call-seconds``, then the next, until the time is up.

Every ``--sample-every`` seconds: the server's RSS (``/proc/PID/status``) and its level gauges on ``/metrics``
(``callbridge_live_streams``, ``_detached_sessions``, ``_engine_sessions_open``, ``_local_engine_sessions``,
``_background_tasks``, ``_asyncio_tasks``, ``_registry_entries``). At the end, once the engine's disconnect grace
has passed, these must all be back at zero (tasks: back at the idle baseline measured before the first call).

Frames lost outside flushes: for each media stream, the agent frames the bridge sent on it (its ``call_ended`` /
``stream_detached`` log line: ``frames_sent``; frames a barge-in flushed are never sent) against the frames the
carrier received on it. Streams the caller hung up (or the bridge ended) must match exactly; on a stream the
soak dropped, frames the bridge wrote after the drop are in flight and reported apart.

    python bench/soak.py --calls 20 --minutes 30 [--providers twilio,telnyx] [--json out.json]

Exit status 1 when a must-be-zero figure (leaked sessions or tasks, frames lost, failed calls) is not zero.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))
from loadtest_carriers import CALLBRIDGE, _env_for

from callbridge.config import load_settings
from callbridge.sim.carrier import OpenReason, SimStream, SimulatedCarrier
from callbridge.sim.load_probes import server_rss_mb
from callbridge.sim.loadtest import LoadReport, LoadTest, LoadTestOptions, _Call
from callbridge.sim.runner import load_wav_8k, sample_caller_wav, wait_http_up
from callbridge.sim.simulators import simulated

SIMULATED = simulated()

LEVEL_GAUGES = (
    "callbridge_live_streams",
    "callbridge_detached_sessions",
    "callbridge_engine_sessions_open",
    "callbridge_local_engine_sessions",
)
"""Must be 0 once every call is over and the grace has passed."""
BASELINE_GAUGES = ("callbridge_asyncio_tasks", "callbridge_background_tasks")
"""Must be back at their idle level (the server's own tasks: its listener, the loop-lag sampler)."""
TASKS = "callbridge_asyncio_tasks"
REGISTRY = "callbridge_registry_entries"
COUNTERS = ("callbridge_barge_ins_total", "callbridge_frames_flushed_total", "callbridge_engine_sessions_total")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(url: str) -> dict[str, float]:
    """``/metrics`` as name → value, labelled samples summed per name."""
    with urllib.request.urlopen(url + "/metrics", timeout=15) as response:
        text = response.read().decode()
    values: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] += sample.value
    return dict(values)


@dataclass
class StreamRecord:
    provider: str
    call_id: str
    frame_bytes: int
    bytes_received: int = 0
    dropped: bool = False
    """The soak dropped this stream (no goodbye): frames the bridge sent after that are in flight, not lost."""
    hung_up: bool = False


class SoakCalls(LoadTest):
    """``LoadTest`` that also counts the agent audio each media stream received."""

    def __init__(self, carrier: SimulatedCarrier, options: LoadTestOptions, streams: dict[str, StreamRecord]) -> None:
        super().__init__(carrier, options)
        self.streams = streams

    def _on_audio(self, call: _Call, stream: SimStream, pcm: bytes | bytearray | memoryview) -> None:
        self._record(stream).bytes_received += len(pcm)
        super()._on_audio(call, stream, pcm)

    async def _open(self, call: _Call, reason: OpenReason) -> None:
        await super()._open(call, reason)
        if call.stream is not None:
            self._record(call.stream)

    async def _drop(self, call: _Call, stream: SimStream) -> None:
        self._record(stream).dropped = True
        await super()._drop(call, stream)

    async def _hang_up(self, stream: SimStream, call: _Call) -> None:
        self._record(stream).hung_up = True
        await super()._hang_up(stream, call)

    def _record(self, stream: SimStream) -> StreamRecord:
        record = self.streams.get(stream.stream_id)
        if record is None:
            record = self.streams[stream.stream_id] = StreamRecord(
                self.carrier.provider, stream.call.call_id, stream.frame_bytes
            )
        return record


@dataclass
class Totals:
    calls: int = 0
    failed_calls: int = 0
    reconnects: int = 0
    barge_ins: int = 0
    frames_sent: int = 0
    frames_received: int = 0
    protocol_warnings: int = 0
    failures: list[str] = field(default_factory=list)
    failed_call_ids: set[str] = field(default_factory=set)

    def add(self, report: LoadReport) -> None:
        self.calls += report.calls
        self.failed_calls += report.failed_calls
        self.reconnects += report.reconnects
        self.barge_ins += report.barge_ins
        self.frames_sent += report.frames_sent
        self.frames_received += report.frames_received
        self.protocol_warnings += report.protocol_warnings
        self.failures += report.failures[:3]


class Soak:
    def __init__(
        self, args: argparse.Namespace, url: str, server_pid: int, carriers: list[SimulatedCarrier], lead_ms: int
    ) -> None:
        self.args = args
        self.in_flight_frames = lead_ms // 20 + 2
        """The most frames a stream can have on the wire when its caller's side goes (hang-up or drop): what the
        bridge sends ahead of real time, and a frame or two in transit."""
        self.url = url
        self.server_pid = server_pid
        self.carriers = carriers
        self.streams: dict[str, StreamRecord] = {}
        self.totals = Totals()
        self.samples: list[dict[str, float]] = []
        self.scrape_failures = 0
        self.started = 0.0
        self.rng = random.Random(args.seed)
        self.audio = load_wav_8k(sample_caller_wav())

    async def sample(self) -> dict[str, float]:
        """RSS and the gauges now; a scrape that fails (a loaded machine) is retried, and counted."""
        for attempt in range(5):
            try:
                metrics = await asyncio.to_thread(scrape, self.url)
                break
            except OSError as exc:  # URLError and timeouts are OSErrors
                self.scrape_failures += 1
                print(f"  scrape failed ({exc!r}), retrying", flush=True)
                await asyncio.sleep(1.0 + attempt)
        else:
            raise RuntimeError(f"{self.url}/metrics does not answer")
        row = {"t_s": time.monotonic() - self.started, "rss_mb": server_rss_mb(self.server_pid)}
        row.update({name: metrics.get(name, 0.0) for name in (*LEVEL_GAUGES, *BASELINE_GAUGES, REGISTRY, *COUNTERS)})
        self.samples.append(row)
        return row

    async def lane(self, index: int, carrier: SimulatedCarrier, end_at: float) -> None:
        args = self.args
        low, high = args.call_seconds
        await asyncio.sleep(index * args.ramp / max(1, args.calls))
        while (left := end_at - time.monotonic()) > low / 2:
            options = LoadTestOptions(
                calls=1, ramp_s=0.0, duration_s=min(left, self.rng.uniform(low, high)), audio=self.audio,
                barge_in_every_ms=int(args.barge_in_every * 1000), dtmf_every_ms=int(args.dtmf_every * 1000) or None,
                drop_every_ms=int(args.drop_every * 1000) or None, progress=False,
            )  # fmt: skip
            calls = SoakCalls(carrier, options, self.streams)
            self.totals.add(await calls.run())
            self.totals.failed_call_ids.update(c.sim.call_id for c in calls._calls if c.failed)
            for call in calls._calls:  # the simulator keeps every call it placed: not the bridge's memory, but ours
                carrier.calls.pop(call.sim.call_id, None)
            await asyncio.sleep(self.rng.uniform(0.0, 1.0))

    async def sampler(self, stop: asyncio.Event) -> None:
        try:
            await self._sample_until(stop)
        except Exception:
            traceback.print_exc()  # now, not when the run ends
            raise

    async def _sample_until(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            row = await self.sample()
            minute = row["t_s"] / 60
            print(
                f"  {minute:6.1f} min: RSS {row['rss_mb']:.1f} MB, streams {row['callbridge_live_streams']:.0f}, "
                f"detached {row['callbridge_detached_sessions']:.0f}, engine {row['callbridge_local_engine_sessions']:.0f}, "
                f"tasks {row[TASKS]:.0f}, registry {row[REGISTRY]:.0f}; {self.totals.calls} calls done "
                f"({self.totals.failed_calls} failed), {self.totals.reconnects} reconnects, {self.totals.barge_ins} barge-ins",
                flush=True,
            )
            try:
                await asyncio.wait_for(stop.wait(), self.args.sample_every)
            except TimeoutError:
                pass

    async def run(self) -> dict[str, Any]:
        args = self.args
        await asyncio.sleep(1.0)
        self.started = time.monotonic()
        idle = await self.sample()
        end_at = self.started + args.minutes * 60
        stop = asyncio.Event()
        sampler = asyncio.create_task(self.sampler(stop))
        per = [self.carriers[i % len(self.carriers)] for i in range(args.calls)]
        await asyncio.gather(*(self.lane(i, carrier, end_at) for i, carrier in enumerate(per)))
        calls_over = time.monotonic()
        stop.set()
        await sampler
        # every call is over: how long until every level is back (settle), then the final levels once the engine's
        # disconnect grace has surely passed (nothing may come back late)
        deadline = calls_over + args.grace + 30
        while True:
            final = await self.sample()
            back = all(final[name] == 0 for name in LEVEL_GAUGES) and all(final[n] <= idle[n] for n in BASELINE_GAUGES)
            if back or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        settle_s = time.monotonic() - calls_over
        await asyncio.sleep(max(0.0, calls_over + args.grace + 1.0 - time.monotonic()))
        final = await self.sample()
        return self.result(idle, final, settle_s)

    def result(self, idle: dict[str, float], final: dict[str, float], settle_s: float) -> dict[str, Any]:
        sent = _frames_sent_by_stream(self.args.server_log)
        refused = _refused_calls(self.args.server_log)
        lost = in_flight = extra = unmatched = misread = 0
        lossy: list[dict[str, Any]] = []
        ends = _stream_ends(self.args.server_log)
        for stream_id, record in self.streams.items():
            if stream_id not in sent:
                unmatched += 1  # the bridge never bound it, or its end was never logged
                continue
            ended = ends[stream_id]
            # a hang-up the bridge took for a drop keeps the session for a resume nobody makes; a drop taken for a
            # hang-up ends a call the carrier is about to reconnect
            if (record.hung_up and not ended.startswith("call_ended")) or (
                record.dropped and ended.startswith("call_ended")
            ):
                misread += 1
            diff = sent[stream_id] - record.bytes_received // record.frame_bytes
            if diff < 0:
                extra += -diff
            elif (record.dropped or record.hung_up) and diff <= self.in_flight_frames:
                in_flight += diff
            else:
                lost += diff
            if diff < 0 or diff > self.in_flight_frames or (diff and not (record.dropped or record.hung_up)):
                lossy.append({"stream_id": stream_id, "sent": sent[stream_id], **asdict(record), "ended": ended})
        unmatched += len(sent.keys() - self.streams.keys())  # bridged, but the carrier never saw it
        flushed = sum(f for _, f in _log_frames(self.args.server_log, "frames_flushed"))
        rss = [s["rss_mb"] for s in self.samples]
        leaks = {name: final[name] for name in LEVEL_GAUGES}
        leaks.update({f"{name}_above_idle": max(0.0, final[name] - idle[name]) for name in BASELINE_GAUGES})
        return {
            "minutes": self.args.minutes,
            "calls_concurrent": self.args.calls,
            "providers": self.args.providers,
            "calls_completed": self.totals.calls - self.totals.failed_calls,
            "calls_failed": len(self.totals.failed_call_ids - refused),
            "calls_refused_by_admission": len(self.totals.failed_call_ids & refused),
            "reconnects": self.totals.reconnects,
            "barge_ins": self.totals.barge_ins,
            "barge_ins_flushed_by_bridge": final["callbridge_barge_ins_total"],
            "streams": len(self.streams),
            "streams_unmatched": unmatched,
            "frames_received": self.totals.frames_received,
            "frames_flushed": flushed,
            "frames_lost_outside_flushes": lost,
            "frames_duplicated": extra,
            "frames_in_flight_at_ends": in_flight,
            "in_flight_bound_frames": self.in_flight_frames,
            "stream_ends_misread": misread,
            "leaks": leaks,
            "lossy_streams": lossy[:20],
            "idle_tasks": idle[TASKS],
            "settle_s": settle_s,
            "registry_entries_end": final[REGISTRY],
            "registry_entries_max": max(s[REGISTRY] for s in self.samples),
            "rss_mb": {
                "start": idle["rss_mb"],
                "end": final["rss_mb"],
                "max": max(rss),
                "slope_mb_per_hour": _slope_per_hour(self.samples),
            },
            "protocol_warnings": self.totals.protocol_warnings,
            "scrape_failures": self.scrape_failures,
            "failures": self.totals.failures[:20],
            "samples": self.samples,
        }


def _log_frames(path: Path, key: str) -> list[tuple[str, int]]:
    """(stream id, ``key``) from the server's ``call_ended`` / ``stream_detached`` JSON log lines."""
    found = []
    for line in path.read_text().splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("event") in ("call_ended", "stream_detached") and key in entry and "stream_id" in entry:
            found.append((str(entry["stream_id"]), int(entry[key])))
    return found


def _stream_ends(path: Path) -> dict[str, str]:
    """Stream id → how the bridge saw it end (``call_ended: stop``, ``stream_detached: transport_lost``)."""
    ends = {}
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") in ("call_ended", "stream_detached") and "stream_id" in entry:
                ends[str(entry["stream_id"])] = f"{entry['event']}: {entry.get('reason')}"
    return ends


def _refused_calls(path: Path) -> set[str]:
    """Calls the bridge's admission refused (``call_refused``: over ``server.cpu_budget_percent`` or
    ``max_calls``): the bridge protecting itself, not a fault; counted apart from failed calls."""
    refused = set()
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") == "call_refused" and entry.get("reason") == "capacity":
                refused.add(str(entry["call_id"]))
    return refused


def _frames_sent_by_stream(path: Path) -> dict[str, int]:
    return dict(_log_frames(path, "frames_sent"))


def _slope_per_hour(samples: list[dict[str, float]]) -> float:
    """Least-squares RSS slope over the samples after the first quarter (the warm-up: allocator, caches)."""
    tail = samples[len(samples) // 4 :]
    if len(tail) < 2:
        return 0.0
    xs, ys = [s["t_s"] for s in tail], [s["rss_mb"] for s in tail]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 0.0 if var == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var * 3600


def render(result: dict[str, Any], table_every_min: float) -> str:
    samples = result["samples"]
    rows, next_at = [], 0.0
    for sample in samples[:-1]:
        if sample["t_s"] >= next_at:
            rows.append(sample)
            next_at = sample["t_s"] + table_every_min * 60 - 1
    rows.append(samples[-1])
    lines = [
        "| t (min) | RSS (MB) | live streams | detached | engine sessions | asyncio tasks | registry entries |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        lines.append(
            f"| {s['t_s'] / 60:.1f} | {s['rss_mb']:.1f} | {s['callbridge_live_streams']:.0f} | {s['callbridge_detached_sessions']:.0f} "
            f"| {s['callbridge_local_engine_sessions']:.0f} | {s[TASKS]:.0f} | {s[REGISTRY]:.0f} |"
        )
    rss = result["rss_mb"]
    leaks = result["leaks"]
    leaked = ", ".join(f"{k} {v:.0f}" for k, v in leaks.items())
    lines += [
        "",
        (
            f"RSS: start {rss['start']:.1f} MB, end {rss['end']:.1f} MB, max {rss['max']:.1f} MB, "
            f"slope {rss['slope_mb_per_hour']:+.1f} MB/hour (after the first quarter)"
        ),
        (
            f"calls: {result['calls_completed']} completed, {result['calls_failed']} failed, "
            f"{result['calls_refused_by_admission']} refused by admission (CPU budget); "
            f"{result['reconnects']} reconnects, {result['barge_ins']} barge-ins "
            f"({result['barge_ins_flushed_by_bridge']:.0f} flushes by the bridge), {result['protocol_warnings']} protocol warnings"
        ),
        (
            f"levels back {result['settle_s']:.1f} s after the last call; leaks after the grace: {leaked} "
            f"(idle tasks {result['idle_tasks']:.0f}); registry entries {result['registry_entries_end']:.0f} "
            f"(max {result['registry_entries_max']:.0f})"
        ),
        (
            f"frames: {result['frames_received']} received on {result['streams']} streams, {result['frames_flushed']} "
            f"flushed by barge-ins, lost outside flushes {result['frames_lost_outside_flushes']}, duplicated "
            f"{result['frames_duplicated']}, in flight at drops and hang-ups {result['frames_in_flight_at_ends']} "
            f"(at most {result['in_flight_bound_frames']} per stream); streams unmatched {result['streams_unmatched']}, "
            f"stream ends misread {result['stream_ends_misread']}"
        ),
    ]
    lines += [f"  failed: {failure}" for failure in result["failures"][:10]]
    return "\n".join(lines)


def must_be_zero(result: dict[str, Any]) -> dict[str, float]:
    figures = {f"leak {k}": float(v) for k, v in result["leaks"].items()}
    figures.update(
        frames_lost_outside_flushes=result["frames_lost_outside_flushes"],
        frames_duplicated=result["frames_duplicated"],
        streams_unmatched=result["streams_unmatched"],
        stream_ends_misread=result["stream_ends_misread"],
        calls_failed=result["calls_failed"],
    )
    return {k: v for k, v in figures.items() if v}


async def _generate(
    args: argparse.Namespace, env: dict[str, str], url: str, pid: int, rest_ports: dict[str, int]
) -> dict[str, Any]:
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        settings = load_settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    carriers = []
    try:
        for provider, rest_port in rest_ports.items():
            secret = env[f"CALLBRIDGE_SOAK_SECRET_{provider.upper()}"]
            carrier = SIMULATED[provider](url, secret)
            carriers.append(carrier)
            if carrier.rest_routes():
                await carrier.start_rest(rest_port)
            carrier.configure(settings)
        return await Soak(args, url, pid, carriers, settings.audio.playout_lead_ms).run()
    finally:
        for carrier in carriers:
            await carrier.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20, help="calls up at once (default: 20)")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--providers", default="twilio", help="carriers, comma-separated; calls go round-robin")
    parser.add_argument("--call-seconds", default="30:120", help="each call lasts a random LOW:HIGH seconds")
    parser.add_argument("--ramp", type=float, default=10.0, help="seconds over which the lanes start")
    parser.add_argument(
        "--drop-every", type=float, default=25.0, help="drop each call's media socket every S s (0: never)"
    )
    parser.add_argument("--barge-in-every", type=float, default=6.0, help="talk over the agent at most every S s")
    parser.add_argument("--dtmf-every", type=float, default=15.0, help="press a key every S s (0: never)")
    parser.add_argument(
        "--grace", type=float, default=10.0, help="the engine's disconnect grace (engine.disconnect_grace_s)"
    )
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds between RSS and gauge samples")
    parser.add_argument("--table-every", type=float, default=5.0, help="minutes between rows of the RSS table")
    parser.add_argument(
        "--cpu-budget",
        type=float,
        help="server.cpu_budget_percent (default: the server's, 85; 0: off): a refused call fails",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the result (samples included) as JSON")
    args = parser.parse_args()
    low, _, high = args.call_seconds.partition(":")
    args.call_seconds = (float(low), float(high or low))
    providers = args.providers.split(",")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env: dict[str, str] = {}
    rest_ports = {}
    for provider in providers:
        rest_ports[provider] = _free_port()
        secret = secrets.token_hex(16)
        env.update(_env_for(provider, secret, rest_ports[provider], port))
        env[f"CALLBRIDGE_SOAK_SECRET_{provider.upper()}"] = secret
    env.update(CALLBRIDGE_LOCAL_ENGINE__AGENT="echo", CALLBRIDGE_ENGINE__DISCONNECT_GRACE_S=str(args.grace))
    if args.cpu_budget is not None:
        env["CALLBRIDGE_SERVER__CPU_BUDGET_PERCENT"] = str(args.cpu_budget)
    workdir = Path(tempfile.mkdtemp(prefix="callbridge-soak-"))
    args.server_log = workdir / "server.log"
    print(
        f"soak: {args.calls} calls at once on {args.providers} for {args.minutes:g} min; server log {args.server_log}",
        flush=True,
    )
    with args.server_log.open("wb") as log:
        server = subprocess.Popen(
            [CALLBRIDGE, "serve", "--port", str(port), "--log-level", "info", "--log-format", "json"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_http_up(url + "/healthz", 30)
            result = asyncio.run(_generate(args, env, url, server.pid, rest_ports))
        finally:
            server.kill()
            server.wait(10)
    print(render(result, args.table_every))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    bad = must_be_zero(result)
    if bad:
        print("soak: FAILED, not zero: " + ", ".join(f"{k} {v:g}" for k, v in bad.items()))
        return 1
    print("soak: OK, nothing leaked, no frame lost outside flushes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
