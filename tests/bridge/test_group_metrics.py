"""``/metrics`` of ``callbridge serve --workers 2`` answers for the whole process group (``group_metrics``): a
real supervisor and its two workers on one port, a real ``redis-server``, and the metrics directory the test
points the supervisor at (``PROMETHEUS_MULTIPROC_DIR``) so it can read each worker's own counts from its files.

Proved here: a counter incremented in both workers reads as their sum on every scrape, whichever worker answers,
and the same on each; a stale file of an earlier run does not count; the scrape-time gauges are there (summed,
and ``process_start_time_seconds`` once per live worker); a worker killed outright keeps its counts in the
totals while its live series leave with it, and its replacement's appear.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families
from twilio.request_validator import RequestValidator

from callbridge.compiled import compiled_modules
from callbridge.outbound_http import http_client
from callbridge.sim.runner import free_port
from tests.bridge.twilio_e2e import until
from tests.conftest import wait_http_ok
from tests.redis_server import redis_url

__all__ = ["redis_url"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.timeout(90), pytest.mark.processes]

SECRET = "group-secret-0123456789abcdef"
COUNTER = "callbridge_stream_status_total"
STALE_PID = 999_999


class Workers:
    def __init__(self, process: subprocess.Popen[bytes], url: str, log_path: Path, metrics_dir: Path) -> None:
        self.process, self.url, self.log_path, self.metrics_dir = process, url, log_path, metrics_dir

    def worker_pids(self) -> list[int]:
        started = []
        for line in self.log_path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("event") == "worker_started":
                started.append(int(entry["pid"]))
        return started

    def counted_by_worker(self) -> dict[int, float]:
        """What each worker's own counter file holds for ``COUNTER`` (every label set), by pid."""
        counts: dict[int, float] = {}
        for path in self.metrics_dir.glob("counter_*.db"):
            pid = int(path.stem.split("_")[1])
            for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path)):  # type: ignore[no-untyped-call]
                if json.loads(key)[1] == COUNTER:
                    counts[pid] = counts.get(pid, 0.0) + value
        return counts


@pytest.fixture
def workers(redis_url: str, tmp_path: Path) -> Iterator[Workers]:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    _stale_counter_file(metrics_dir)
    config = tmp_path / "callbridge.toml"
    lines = ["[registry]", 'backend = "redis"', f'redis_url = "{redis_url}"', "[local_engine]", 'agent = "echo"']
    config.write_text("\n".join([*lines, "[twilio]", f'auth_token = "{SECRET}"']) + "\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLBRIDGE_")}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    log_path = tmp_path / "workers.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "callbridge", "serve", "--workers", "2", "--config", str(config), "--port", str(port), "--log-format", "json"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    served = Workers(process, f"http://127.0.0.1:{port}", log_path, metrics_dir)
    try:
        wait_http_ok(served.url + "/readyz", process, timeout_s=60)  # type: ignore[arg-type]
        yield served
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _stale_counter_file(metrics_dir: Path) -> None:
    """A counter file a worker of an earlier run left behind: the supervisor must empty the directory."""
    stale = MmapedDict(str(metrics_dir / f"counter_{STALE_PID}.db"))  # type: ignore[no-untyped-call]
    key = mmap_key(COUNTER.removesuffix("_total"), COUNTER, ["provider", "event"], ["twilio", "stream-started"], "stale")
    stale.write_value(key, 1000.0, 0.0)  # type: ignore[no-untyped-call]
    stale.close()  # type: ignore[no-untyped-call]


async def _post_status(url: str, event: str) -> None:
    """One stream status callback, signed, on a connection of its own (so either worker may take it)."""
    form = {
        "AccountSid": "AC" + "0" * 32, "CallSid": "CA" + "0" * 32, "StreamSid": "MZ" + "0" * 32, "StreamEvent": event,
        "Timestamp": datetime.datetime.now(datetime.UTC).isoformat(),  # as Twilio's: no two callbacks are signed alike
    }  # fmt: skip
    target = url + "/twilio/stream-status"
    signature = RequestValidator(SECRET).compute_signature(target, form)
    async with http_client(timeout=5) as http:
        response = await http.post(target, data=form, headers={"X-Twilio-Signature": signature, "Connection": "close"})
    assert response.status_code == 204


async def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with http_client(timeout=5) as http:
        text = (await http.get(url + "/metrics", headers={"Connection": "close"})).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _total(scraped: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return sum(value for (sample, _), value in scraped.items() if sample == name)


def _pids(scraped: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> set[int]:
    return {int(dict(labels)["pid"]) for (sample, labels), value in scraped.items() if sample == name}


async def test_a_scrape_of_the_shared_port_answers_for_every_worker(workers: Workers) -> None:
    assert not (workers.metrics_dir / f"counter_{STALE_PID}.db").exists()  # emptied at start
    worker_pids = set(workers.worker_pids())
    assert len(worker_pids) == 2
    sent = 0
    while len(workers.counted_by_worker()) < 2:  # until each worker has taken some (the kernel picks the worker)
        await asyncio.gather(*(_post_status(workers.url, "stream-started") for _ in range(10)))
        sent += 10
        assert sent <= 400, f"one worker took all {sent} requests: {workers.counted_by_worker()}"
    by_worker = workers.counted_by_worker()
    assert set(by_worker) == worker_pids and sum(by_worker.values()) == sent
    assert all(0 < count < sent for count in by_worker.values())

    for _ in range(50):  # the loop-lag histogram is first observed half a second after a worker starts
        if _total(await _scrape(workers.url), "callbridge_event_loop_lag_seconds_count") > 0:
            break
        await asyncio.sleep(0.1)
    for _ in range(6):  # each scrape may reach either worker: every one reads the group's sum
        scraped = await _scrape(workers.url)
        labels = (("event", "stream-started"), ("provider", "twilio"))
        assert scraped[(COUNTER, labels)] == sent
        assert _pids(scraped, "process_start_time_seconds") == worker_pids
        assert _total(scraped, "callbridge_asyncio_tasks") > 0  # a scrape-time gauge, copied by every worker
        assert _total(scraped, "callbridge_event_loop_lag_seconds_count") > 0  # histograms summed
        compiled = "true" if compiled_modules() else "false"
        assert scraped[("callbridge_build_info", (("compiled", compiled), ("version", _version())))] == 1


async def test_a_dead_workers_counts_stay_and_its_live_series_leave(workers: Workers) -> None:
    sent = 0
    while len(workers.counted_by_worker()) < 2:
        await asyncio.gather(*(_post_status(workers.url, "stream-stopped") for _ in range(10)))
        sent += 10
        assert sent <= 400, f"one worker took all {sent} requests"
    victim, survivor = sorted(workers.worker_pids())
    os.kill(victim, signal.SIGKILL)

    async def replaced() -> bool:
        scraped = await _scrape(workers.url)
        pids = _pids(scraped, "process_start_time_seconds")
        return len(pids) == 2 and victim not in pids and survivor in pids

    await until(replaced, timeout_s=60)
    assert len(workers.worker_pids()) == 3
    for _ in range(4):
        scraped = await _scrape(workers.url)
        assert scraped[(COUNTER, (("event", "stream-stopped"), ("provider", "twilio")))] == sent  # the victim's part stays
        assert victim not in _pids(scraped, "callbridge_cpu_utilization")


def _version() -> str:
    from callbridge import __version__

    return __version__
