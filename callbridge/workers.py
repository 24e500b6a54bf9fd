"""``callbridge serve --workers N``: N bridge processes on one listening socket, on one host.

The supervisor binds ``server.host``:``server.port`` once and starts N workers (``multiprocessing`` spawn),
each a whole bridge (``callbridge.serving.serve_bridge``: its app, engine client and registry client) accepting
on the inherited socket; the kernel spreads connections among them. A call's webhook, its media socket
and a later stream may each land on a different worker, so workers share call state: in Redis where
``registry.backend`` is redis (a fleet of hosts), else in the supervisor's memory (``registry_host``: the
supervisor serves one memory registry to its workers over a Unix socket; it lives as long as the supervisor).

Listeners that cannot be shared — a carrier's own sockets (``CarrierSpec.sockets``: SIP's dialogs and RTP ports
are one process's state, as is a raw TCP listener's port) — are served by worker 0 alone; the others run with
them disabled. A worker 0 that dies is replaced by a new worker 0,
which binds them again (SIP calls in progress there end with it: SIP has no reconnect). Without this every
worker bound them and all but one died at start, over and over.

Signals: the workers run in their own process group, so a terminal's Ctrl+C reaches only the supervisor.
The supervisor forwards SIGTERM/SIGINT to every worker once per signal it gets: the first drains each
worker (``BridgeServices.drain``), a second stops them at once. A worker that dies while the supervisor is
not stopping is replaced; a worker whose supervisor died drains and exits. Exit 0 when every worker
exited 0, or died by the SIGTERM it was sent: a worker still starting (a replacement, on a busy host seconds in
its imports) has no handler yet and nothing to drain; one that serves has uvicorn's and exits 0.

Metrics: the workers keep them in files of one directory the supervisor owns (``group_metrics``), so
``/metrics`` on the shared port answers for the whole group, whichever worker takes the scrape; the supervisor
empties it at start and drops a dead worker's live gauges. ``/readyz`` is each worker's own.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import time
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from callbridge.carriers import CARRIERS
from callbridge.config import Settings
from callbridge.logging import configure_logging, get_logger

if TYPE_CHECKING:
    from callbridge.bridge.registry_host import HostAddress

__all__ = ["group_exit_code", "serve_workers"]

log = get_logger(__name__)

_POLL_S = 0.2
_METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
_ORPHAN_CHECK_S = 1.0
_UNSHARED_LISTENERS: Final = tuple(spec.section for spec in CARRIERS if spec.sockets and spec.section is not None)
"""Settings sections whose listener only worker 0 runs (a carrier's own sockets: its dialogs, its ports)."""


def _watch_supervisor(supervisor_pid: int) -> None:
    """A worker whose supervisor died (SIGKILL, a crash) drains and exits instead of serving on unsupervised."""
    while os.getppid() == supervisor_pid:
        time.sleep(_ORPHAN_CHECK_S)
    os.kill(os.getpid(), signal.SIGTERM)


def _worker(
    index: int, settings_data: dict[str, Any], sock: socket.socket, metrics_dir: str, registry_host: HostAddress | None
) -> None:
    """A worker's main: its own process group (terminal signals go to the supervisor), then one bridge. Its log
    lines say which worker wrote them (``worker``, the index ``worker_started`` gives with its pid)."""
    import sys
    import threading

    import structlog

    structlog.contextvars.bind_contextvars(worker=index)  # every task of the bridge copies it

    os.environ[_METRICS_DIR_ENV] = metrics_dir  # before prometheus_client is imported: it picks file values then
    from callbridge.bridge.group_metrics import group_metrics_dir
    from callbridge.serving import serve_bridge

    if group_metrics_dir() != metrics_dir:
        log.error("metrics_dir_ignored", path=metrics_dir, detail="prometheus_client was imported before it was set")
    os.setpgrp()
    threading.Thread(target=_watch_supervisor, args=(os.getppid(),), name="supervisor-watch", daemon=True).start()
    settings = Settings.model_validate(settings_data)
    sys.exit(serve_bridge(settings, sockets=[sock], registry_host=registry_host))


def worker_settings(settings_data: dict[str, Any], index: int) -> dict[str, Any]:
    """Worker ``index``'s settings: the group's, with the carriers' own listeners off but in worker 0."""
    if index == 0:
        return settings_data
    return {**settings_data, **{section: {**settings_data[section], "enabled": False} for section in _UNSHARED_LISTENERS}}


def serve_workers(settings: Settings, sock: socket.socket) -> int:
    """Run ``server.workers`` bridge processes on ``sock`` (bound to ``server.host``:``server.port``: the CLI's
    ``bind_http``) until SIGTERM/SIGINT; the exit code of the command."""
    from callbridge.bridge.group_metrics import GroupMetricsDir
    from callbridge.bridge.registry_host import RegistryHost

    configure_logging(settings.log)
    count = settings.server.workers
    host = RegistryHost() if settings.registry.backend == "memory" else None
    if host is not None:
        try:
            host.start()
        except OSError as exc:
            log.error("registry_host_failed", detail=repr(exc), path=host.address.path)
            host.close()
            return 1
    metrics_dir = GroupMetricsDir.create()
    context = multiprocessing.get_context("spawn")
    settings_data = settings.model_dump()
    workers: list[BaseProcess] = []
    received: list[int] = []
    """Signals the supervisor got and has not forwarded yet (the handler only records them)."""

    def start(index: int) -> BaseProcess:
        data = worker_settings(settings_data, index)
        address = host.address if host is not None else None
        process = context.Process(target=_worker, args=(index, data, sock, str(metrics_dir.path), address), name=f"callbridge-worker-{index}")
        process.start()
        listeners = [section for section in _UNSHARED_LISTENERS if data[section]["enabled"]]
        log.info("worker_started", pid=process.pid, index=index, listeners=["http", *listeners])
        return process

    def record(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, record)
    log.info("workers_starting", workers=count, host=settings.server.host, port=settings.server.port)
    workers.extend(start(index) for index in range(count))
    stopping = False
    while not (stopping and all(process.exitcode is not None for process in workers)):
        time.sleep(_POLL_S)
        while received:
            forwarded = received.pop(0)
            stopping = True
            for process in workers:
                if process.pid is not None and process.exitcode is None:
                    os.kill(process.pid, forwarded)
        if not stopping:
            for index, process in enumerate(workers):
                if process.exitcode is not None:
                    log.warning("worker_died", pid=process.pid, exit_code=process.exitcode)
                    if process.pid is not None:
                        metrics_dir.worker_exited(process.pid)
                    workers[index] = start(index)
    sock.close()
    metrics_dir.close()
    if host is not None:
        host.close()
    exit_codes = [process.exitcode for process in workers]
    log.info("workers_stopped", exit_codes=exit_codes)
    return group_exit_code(exit_codes)


def group_exit_code(exit_codes: list[int | None]) -> int:
    """The group's exit code from its workers' once stopped: 0 where each exited 0 or died by the SIGTERM it was
    sent (still starting: no handler yet, nothing to drain), else 1."""
    return 0 if all(code == 0 or code == -signal.SIGTERM for code in exit_codes) else 1
