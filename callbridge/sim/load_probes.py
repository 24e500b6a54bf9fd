"""What a load test reads of the bridge it runs against (``callbridge.sim.loadtest``): its ``/metrics`` histograms,
and the CPU and memory of its processes (``--server-pid``)."""

from __future__ import annotations

import contextlib
from typing import Final

import psutil

from callbridge.outbound_http import http_client

__all__ = ["FIRST_AUDIO_METRIC", "first_audio_since", "scrape_histogram", "server_cpu_ms", "server_rss_mb"]

FIRST_AUDIO_METRIC: Final = "callbridge_first_audio_to_engine_seconds"


async def scrape_histogram(base_url: str, name: str) -> dict[float, float]:
    """A histogram of the bridge's ``/metrics``, cumulative: bucket bound (s) → count ({} when unreachable)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        async with http_client(timeout=5.0) as http:
            text = (await http.get(base_url.rstrip("/") + "/metrics")).text
    except httpx.HTTPError:
        return {}
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name + "_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return buckets


async def first_audio_since(base_url: str, before: dict[float, float]) -> dict[float, float] | None:
    """What the bridge's first-audio histogram counted since ``before`` (an earlier scrape); None when it cannot
    be read now."""
    after = await scrape_histogram(base_url, FIRST_AUDIO_METRIC)
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()} if after else None


def server_processes(pid: int) -> list[psutil.Process]:
    """The server and every process under it (``serve --workers N``: the supervisor and its workers)."""
    server = psutil.Process(pid)
    return [server, *server.children(recursive=True)]


def server_cpu_ms(pid: int) -> float:
    """The CPU (user + system) the server's processes have used so far; a worker that exited since is not counted."""
    total = 0.0
    for process in server_processes(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += (times.user + times.system) * 1000
    return total


def server_rss_mb(pid: int) -> float:
    """The resident memory of the server's processes, summed (pages they share counted in each)."""
    total = 0
    for process in server_processes(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total / 2**20
