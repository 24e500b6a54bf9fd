"""One ``/metrics`` for a process group (``callbridge serve --workers N``): whichever worker a scrape of the shared
port reaches answers for all of them.

Strategy: prometheus_client's multiprocess mode. The supervisor gives its workers one directory
(``GroupMetricsDir``, ``PROMETHEUS_MULTIPROC_DIR``, emptied at start), set in each worker before anything imports
prometheus_client, which then keeps every metric's value in an mmap'd file of that worker there (a lock and a
write into a page per increment, no I/O call; nothing is counted per frame). The worker that answers a scrape
reads every worker's files (``MultiProcessCollector``):

- counters and histograms are summed, a dead worker's files included: what it counted stays counted, so a
  group total never goes back (a sum of live workers only would, and Prometheus would read that as a reset);
- gauges aggregate by the mode each declares; ours are ``livesum`` (``callbridge_calls_active`` and the level
  gauges: the group's calls, streams, tasks), and a dead worker's part leaves with it: the supervisor drops
  its live-gauge files (``mark_process_dead``) when it sees it exit.

What a worker computes only when scraped is in no file: its level gauges' callbacks, the engine pool's collector
and the process collector. ``GroupPublisher`` copies them into the worker's files every ``PUBLISH_EVERY_S``
(and the answering worker's, just before it answers), so another worker's part may be that old: gauges summed
over live workers (``livesum``) except where a sum means nothing — ``process_start_time_seconds`` stays one
series per worker (``liveall``, labelled ``pid``) and ``process_max_fds`` is the max —, counters as counters
(by their increase since the last copy). The build info is the same in every worker: the answering one's.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from callbridge.logging import get_logger

__all__ = ["MULTIPROC_DIR_ENV", "PUBLISH_EVERY_S", "GroupMetricsDir", "GroupPublisher", "group_metrics_dir"]

log = get_logger(__name__)

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
PUBLISH_EVERY_S = 1.0
"""How often a worker copies its scrape-time values into its files: how old another worker's part may be."""

GaugeMode = Literal["livesum", "liveall", "livemax"]
_GAUGE_MODES: dict[str, GaugeMode] = {"process_start_time_seconds": "liveall", "process_max_fds": "livemax"}
"""Gauges a sum over workers would make meaningless; every other copied gauge is summed (``livesum``)."""


def group_metrics_dir() -> str | None:
    """The group's directory where this process keeps its metrics in files (a ``--workers`` worker), else None."""
    if not getattr(values.ValueClass, "_multiprocess", False):
        return None
    return os.environ.get(MULTIPROC_DIR_ENV)


class GroupMetricsDir:
    """The supervisor's side: the directory its workers keep their metrics in.

    ``PROMETHEUS_MULTIPROC_DIR`` where the operator set it (it must be empty of other processes' files: it is
    emptied now, so files of an earlier run's dead workers never count), else a new temporary directory, removed
    by ``close``."""

    def __init__(self, path: Path, *, owned: bool) -> None:
        self.path = path
        self._owned = owned

    @classmethod
    def create(cls) -> GroupMetricsDir:
        configured = os.environ.get(MULTIPROC_DIR_ENV)
        if not configured:
            return cls(Path(tempfile.mkdtemp(prefix="callbridge-metrics-")), owned=True)
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        stale = list(path.glob("*.db"))
        for file in stale:
            file.unlink(missing_ok=True)
        if stale:
            log.info("metrics_dir_cleared", path=str(path), files=len(stale))
        return cls(path, owned=False)

    def worker_exited(self, pid: int) -> None:
        """A worker is gone: its live gauges stop counting (its counters and histograms keep what they counted)."""
        mark_process_dead(pid, str(self.path))  # type: ignore[no-untyped-call]

    def close(self) -> None:
        if self._owned:
            shutil.rmtree(self.path, ignore_errors=True)


class GroupPublisher:
    """A worker's side: copies what it computes at scrape time into its files (``publish``) and answers a scrape
    with the whole group's metrics (``scrape``).

    ``gauges`` are the worker's own callback gauges (``Gauge.set_function``, unlabelled, declared ``livesum``):
    each is set to what its callback says, which writes its file. ``collectors`` compute their families at scrape
    time (the process and the engine pool collectors): each sample goes to a copy metric of the same name and
    labels. ``static`` is added to every scrape as this worker has it (the build info)."""

    def __init__(self, path: str, gauges: Sequence[Gauge], collectors: Sequence[Collector], static: Sequence[Collector] = ()) -> None:
        self._gauges = tuple(gauges)
        self._collectors = tuple(collectors)
        self._copies: dict[tuple[str, tuple[str, ...]], Gauge | Counter] = {}
        self._counted: dict[tuple[str, tuple[str, ...]], float] = {}
        self.registry = CollectorRegistry()
        MultiProcessCollector(self.registry, path=path)  # type: ignore[no-untyped-call]
        for collector in static:
            self.registry.register(collector)

    def scrape(self) -> bytes:
        """The group's exposition: this worker's scrape-time values fresh, the others' as last published."""
        self.publish()
        return generate_latest(self.registry)

    async def run(self, every_s: float = PUBLISH_EVERY_S) -> None:
        """Publish every ``every_s`` until cancelled (a background task of the worker)."""
        while True:
            try:
                self.publish()
            except Exception as exc:  # noqa: BLE001 - a collector's failure never stops the copies of the others
                log.warning("metrics_publish_failed", error=repr(exc))
            await asyncio.sleep(every_s)

    def publish(self) -> None:
        for gauge in self._gauges:
            for family in gauge.collect():
                for sample in family.samples:
                    gauge.set(sample.value)
        for collector in self._collectors:
            for family in collector.collect():
                if family.type == "gauge":
                    self._copy(family.name, family.documentation, "gauge", (s for s in family.samples if s.name == family.name))
                elif family.type == "counter":
                    total = family.name + "_total"
                    self._copy(family.name, family.documentation, "counter", (s for s in family.samples if s.name == total))

    def _copy(self, name: str, documentation: str, kind: Literal["gauge", "counter"], samples: Iterable[Sample]) -> None:
        for sample in samples:
            labels, value = sample.labels, sample.value
            names = tuple(sorted(labels))
            metric = self._copies.get((name, names))
            if metric is None:
                if kind == "gauge":
                    mode = _GAUGE_MODES.get(name, "livesum")
                    metric = Gauge(name, documentation, names, registry=None, multiprocess_mode=mode)
                else:
                    metric = Counter(name, documentation, names, registry=None)
                self._copies[(name, names)] = metric
            child = metric.labels(*(labels[n] for n in names)) if names else metric
            if isinstance(child, Gauge):
                child.set(value)
                continue
            assert isinstance(child, Counter)
            key = (name, tuple(labels[n] for n in names))
            increase = value - self._counted.get(key, 0.0)
            self._counted[key] = value
            if increase > 0:  # (a source that went back, restarted, counts on from its new value)
                child.inc(increase)
