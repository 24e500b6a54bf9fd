"""``callbridge loadtest --processes N``: the calls split across N generator processes, so that the generator is
never the bottleneck, and their raw samples merged into one report.

The parent spawns N children (``multiprocessing``, spawn). Child ``k`` places the calls whose index ``i`` has
``i % N == k`` — on the same ramp, one 20 ms timer for its calls, the children's ticks interleaved — against the
same ``url``, and reports to the parent over a pipe: ready (and its REST port), about once a second its calls up,
frames sent and the latencies measured since the last report (the parent's live progress line), and at the end
its raw ``LoadSamples``. The parent merges them (``merge_samples``: every percentile over all the samples, never an
average of the children's) and measures the server's CPU and RSS once, over the whole run.

Carriers whose bridge calls a REST API back (hang-ups; call control that answers every call) see one
``api_base_url``: the parent serves ``--rest-port`` and forwards each request to the child that placed the call
named in its path (each child picks call ids ``shard_of`` maps to it, so the route is a hash, with no table to
keep in step). A carrier whose REST routes name no call cannot be shared: ``shareable_problem`` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Final

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route

from callbridge.carriers import carrier_spec
from callbridge.config import Settings
from callbridge.sim.carrier import SimulatedCarrier, webhook_client
from callbridge.sim.load_probes import (
    FIRST_AUDIO_METRIC,
    first_audio_since,
    scrape_histogram,
    server_cpu_ms,
    server_rss_mb,
)
from callbridge.sim.load_samples import LoadSamples, merge_samples, progress_line
from callbridge.sim.loadtest import LoadTest, LoadTestOptions, shard_of
from callbridge.sim.ports import free_port
from callbridge.sim.simulators import simulator_class

__all__ = ["CALLS_PER_PROCESS", "processes_for", "run_pooled", "shareable_problem"]

CALLS_PER_PROCESS: Final = 120
"""``--processes auto``: at most this many calls per generator process (one process keeps its tick lag low up to
about this many on this machine class), and never more processes than CPUs."""
_CALL_PARAMS: Final = ("call", "call_control_id", "uuid", "sid", "request")
"""The path parameter that names the call in each simulated carrier's REST routes."""
_READY_TIMEOUT_S: Final = 120.0
"""Spawning a child imports numpy, the carriers and their crypto: seconds on a busy machine."""
_START_DELAY_S: Final = 0.3
_EXIT_TIMEOUT_S: Final = 15.0
"""After its report, a process closes its carrier (the last webhooks) and exits."""
_HOP_HEADERS: Final = frozenset({"host", "content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"})

ProgressPrinter = Callable[[str], None]


def processes_for(calls: int, requested: int | None) -> int:
    """How many generator processes: ``requested``, or for None (``auto``) enough that each carries at most
    ``CALLS_PER_PROCESS`` calls, capped at the CPU count; never more than there are calls."""
    wanted = requested if requested is not None else min(os.cpu_count() or 1, math.ceil(calls / CALLS_PER_PROCESS))
    return max(1, min(wanted, calls))


def _call_param(route: BaseRoute) -> str | None:
    names = getattr(route, "param_convertors", {})
    return next((name for name in _CALL_PARAMS if name in names), None)


def shareable_problem(carrier: SimulatedCarrier) -> str | None:
    """Why ``carrier`` cannot be split across processes (None: it can)."""
    unrouted = [
        path
        for route in carrier.rest_routes()
        if _call_param(route) is None and (path := getattr(route, "path", repr(route))) not in carrier.stateless_rest_paths
    ]
    if unrouted:
        return f"its REST routes {unrouted} name no call, so the processes cannot share --rest-port"
    return None


# ------------------------------------------------------------------------------------------------ the child


@dataclass(frozen=True, slots=True)
class _Job:
    settings: dict[str, Any]
    """``Settings.model_dump()`` (what ``load_settings`` returns is a local class: it does not pickle)."""
    provider: str
    options: LoadTestOptions
    url: str
    secret: str


def _child_main(job: _Job, conn: Connection) -> None:
    """A generator process (spawned): its share of the calls, reported over ``conn``."""
    from callbridge.logging import configure_logging

    configure_logging(Settings.model_validate(job.settings).log)
    runner: Callable[[Any], None] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    try:
        runner(_child(job, conn))
    except BaseException as exc:  # noqa: BLE001 - whatever it was, the parent reports it
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


async def _child(job: _Job, conn: Connection) -> None:
    carrier = simulator_class(carrier_spec(job.provider))(job.url, job.secret)
    try:
        port: int | None = None
        if carrier.rest_routes():
            port = free_port()
            await carrier.start_rest(port)
        carrier.configure(Settings.model_validate(job.settings))
        conn.send(("ready", port))
        message = await asyncio.to_thread(conn.recv)
        if message[0] != "go":
            return
        test = LoadTest(carrier, replace(job.options, start_at=message[1]))

        def progress(up: int, frames: int, round_trips: list[float], barge_ins: list[float]) -> None:
            conn.send(("progress", up, frames, round_trips, barge_ins))

        test.on_progress = progress
        conn.send(("done", await test.run_samples()))
    finally:
        await carrier.aclose()


# ----------------------------------------------------------------------------------------------- the parent


class _RestRouter:
    """The simulated carrier's REST API on ``--rest-port``: each request goes to the child that placed its call."""

    def __init__(self, routes: list[BaseRoute], shards: int, stateless: frozenset[str] = frozenset()) -> None:
        self.routes = routes
        self.shards = shards
        self.stateless = stateless
        self.ports: dict[int, int] = {}
        self._http = webhook_client()
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        self.app = Starlette(routes=[Route("/{path:path}", self._forward, methods=methods)])
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, port: int) -> None:
        with socket.socket() as probe:  # uvicorn exits the process when it cannot bind: say why instead
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as exc:
                raise OSError(f"the carrier's REST API cannot listen on 127.0.0.1:{port} (--rest-port): {exc.strerror}") from None
        config = uvicorn.Config(self.app, host="127.0.0.1", port=port, log_config=None, lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise OSError(f"the carrier's REST API could not listen on 127.0.0.1:{port}")
            await asyncio.sleep(0.01)

    async def aclose(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.gather(self._task, return_exceptions=True)
        await self._http.aclose()

    def shard_for(self, method: str, path: str) -> int | None:
        scope = {"type": "http", "method": method, "path": path}
        for route in self.routes:
            match, child_scope = route.matches(scope)
            name = _call_param(route)
            if match is Match.FULL and name is not None:
                return shard_of(str(child_scope["path_params"][name]), self.shards)
            if match is Match.FULL and getattr(route, "path", None) in self.stateless:
                return 0  # any process answers it alike
        return None

    async def _forward(self, request: Request) -> Response:
        shard = self.shard_for(request.method, request.url.path)
        port = self.ports.get(shard) if shard is not None else None
        if port is None:
            return JSONResponse({"error": "not found"}, status_code=404)
        url = f"http://127.0.0.1:{port}{request.url.path}" + (f"?{request.url.query}" if request.url.query else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        upstream = await self._http.request(request.method, url, headers=headers, content=await request.body())
        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
        return Response(upstream.content, status_code=upstream.status_code, headers=kept)


@dataclass
class _Child:
    shard: int
    process: BaseProcess
    conn: Connection
    rest_port: int | None = None
    ready: bool = False
    samples: LoadSamples | None = None
    up: int = 0
    frames: int = 0


async def run_pooled(
    settings: Settings,
    provider: str,
    options: LoadTestOptions,
    *,
    processes: int,
    url: str,
    secret: str,
    rest_port: int,
    print_progress: ProgressPrinter | None = None,
) -> LoadSamples:
    """``options.calls`` calls split across ``processes`` generator processes against the bridge at ``url``, the
    carrier's REST API served on ``rest_port``: the merged samples, with the server's CPU and RSS (given
    ``options.server_pid``). Raises ``ValueError`` for a carrier that cannot be shared (``shareable_problem``),
    ``RuntimeError`` when a process fails, ``OSError`` when the REST port is taken."""
    probe = simulator_class(carrier_spec(provider))(url, secret)
    try:
        problem, routes, stateless = shareable_problem(probe), probe.rest_routes(), probe.stateless_rest_paths
    finally:
        await probe.aclose()
    if problem is not None:
        raise ValueError(f"{provider} cannot run in several processes: {problem}")
    router = _RestRouter(routes, processes, stateless) if routes else None
    context = multiprocessing.get_context("spawn")
    children: list[_Child] = []
    try:
        if router is not None:
            await router.start(rest_port)
        for shard in range(processes):
            share = replace(options, shard=shard, shards=processes, progress=False, server_pid=None, metrics_url=None)
            children.append(_start_child(context, shard, _Job(settings.model_dump(), provider, share, url, secret)))
        await _all_ready(children)
        if router is not None:
            router.ports = {child.shard: child.rest_port for child in children if child.rest_port is not None}
        server_before = server_cpu_ms(options.server_pid) if options.server_pid else None
        first_audio_before = await scrape_histogram(options.metrics_url, FIRST_AUDIO_METRIC) if options.metrics_url else {}
        start_at = time.monotonic() + _START_DELAY_S
        for child in children:
            child.conn.send(("go", start_at))
        round_trips: list[float] = []
        barge_ins: list[float] = []
        last_print = start_at
        while not all(child.samples is not None for child in children):
            for more_round_trips, more_barge_ins in _poll(children):
                round_trips += more_round_trips
                barge_ins += more_barge_ins
            now = time.monotonic()
            if print_progress is not None and now - last_print >= 5:
                last_print = now
                up, frames = sum(c.up for c in children), sum(c.frames for c in children)
                print_progress(progress_line(now - start_at, up, frames, round_trips, barge_ins))
            await asyncio.sleep(0.05)
        merged = merge_samples([child.samples for child in children if child.samples is not None])
        if options.server_pid and server_before is not None:
            merged.server_cpu_ms = server_cpu_ms(options.server_pid) - server_before
            merged.server_rss_mb = server_rss_mb(options.server_pid)
        if options.metrics_url:
            merged.first_audio_buckets = await first_audio_since(options.metrics_url, first_audio_before)
        return merged
    finally:
        await _end_children(children)
        if router is not None:
            await router.aclose()


def _start_child(context: Any, shard: int, job: _Job) -> _Child:
    ours, theirs = context.Pipe()
    process = context.Process(target=_child_main, args=(job, theirs), name=f"callbridge-loadtest-{shard}", daemon=True)
    process.start()
    theirs.close()
    return _Child(shard, process, ours)


async def _all_ready(children: list[_Child]) -> None:
    """Wait until every generator process has set up its calls (``RuntimeError`` after ``_READY_TIMEOUT_S``)."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while not all(child.ready for child in children):
        _poll(children)
        if time.monotonic() > deadline:
            raise RuntimeError(f"generator processes not ready after {_READY_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.02)


async def _end_children(children: list[_Child]) -> None:
    """Let the generator processes end (one still waiting for "go" ends as its pipe closes); kill those that do
    not within ``_EXIT_TIMEOUT_S``."""
    for child in children:
        with contextlib.suppress(OSError):
            child.conn.close()
    deadline = time.monotonic() + _EXIT_TIMEOUT_S
    while any(child.process.is_alive() for child in children) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # the REST API still answers the processes' last calls meanwhile
    for child in children:
        if child.process.is_alive():
            child.process.kill()
        child.process.join(timeout=5)


def _poll(children: list[_Child]) -> list[tuple[list[float], list[float]]]:
    """Read what the children sent; the latencies of their progress reports. Raises if one failed or died."""
    latencies: list[tuple[list[float], list[float]]] = []
    for child in children:
        try:
            while child.samples is None and child.conn.poll():
                message = child.conn.recv()
                kind = message[0]
                if kind == "ready":
                    child.ready, child.rest_port = True, message[1]
                elif kind == "progress":
                    child.up, child.frames = message[1], message[2]
                    latencies.append((message[3], message[4]))
                elif kind == "done":
                    child.samples = message[1]
                elif kind == "error":
                    raise RuntimeError(f"generator process {child.shard}: {message[1]}")
        except EOFError:
            pass
        if child.samples is None and not child.process.is_alive() and not child.conn.poll():
            raise RuntimeError(f"generator process {child.shard} exited ({child.process.exitcode}) before its report")
    return latencies
