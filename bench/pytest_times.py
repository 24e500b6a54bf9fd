"""Where the suite's time goes: each test's wall time and CPU time (its process's, and its reaped children's: the
servers it started), by file and by xdist worker. A pytest plugin, then a summary.

    PYTHONPATH=bench .venv/bin/python -m pytest -p pytest_times     # writes .cache/pytest_times/<worker>.json
    python bench/pytest_times.py                                      # the summary of the last run

The wall time of a test is what it waited (most end-to-end tests wait at real time); its CPU is what it cost the
machine's two cores. Their sums, against the run's wall time and its workers, say whether more workers would help
(the tests wait) or not (the cores are busy). It also records each worker's garbage-collector pauses (those over
20 ms, with the test they fell in: a pause stops that worker's calls as a stall does) and the machine's busy share
over the run (``/proc/stat``).
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

OUT = Path(__file__).resolve().parent.parent / ".cache" / "pytest_times"
_rows: list[tuple[str, float, float]] = []
_pauses: list[tuple[str, int, float]] = []
_gc = {"total_s": 0.0, "started": 0.0, "test": ""}


def _on_gc(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc["started"] = time.perf_counter()
        return
    took = time.perf_counter() - float(_gc["started"])
    _gc["total_s"] = float(_gc["total_s"]) + took
    if took > 0.02:
        _pauses.append((str(_gc["test"]), info["generation"], took))


gc.callbacks.append(_on_gc)


def _machine_busy() -> tuple[float, float]:
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


_started = _machine_busy()


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Generator[None, None, None]:
    cpu, wall = _cpu_s(), time.monotonic()
    _gc["test"] = item.nodeid
    yield
    _rows.append((item.nodeid, _cpu_s() - cpu, time.monotonic() - wall))


def pytest_sessionfinish(session: Any) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (OUT / f"{name}.json").write_text(json.dumps(_rows))
    busy, total = (now - then for now, then in zip(_machine_busy(), _started, strict=True))
    gc_row = {"gc_s": _gc["total_s"], "pauses": _pauses, "machine_busy": busy / max(total, 1.0)}
    (OUT / f"{name}.gc").write_text(json.dumps(gc_row))


def main() -> int:
    rows: list[tuple[str, float, float]] = []
    for path in sorted(OUT.glob("*.json")):
        worker = json.loads(path.read_text())
        rows += worker
        print(f"{path.stem}: {len(worker)} tests, {sum(r[2] for r in worker):.0f} s wall, {sum(r[1] for r in worker):.0f} s CPU")
    print(f"all: {len(rows)} tests, {sum(r[2] for r in rows):.0f} s wall, {sum(r[1] for r in rows):.0f} s CPU")
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for nodeid, cpu, wall in rows:
        totals = by_file[nodeid.split("::")[0]]
        totals[0] += wall
        totals[1] += cpu
        totals[2] += 1
    pauses: list[tuple[str, int, float]] = []
    for path in sorted(OUT.glob("*.gc")):
        row = json.loads(path.read_text())
        pauses += row["pauses"]
        if path.stem == "main":
            print(f"the machine's cores were busy {100 * row['machine_busy']:.0f}% of the run")
        else:
            print(f"{path.stem}: {row['gc_s']:.1f} s in the garbage collector, {len(row['pauses'])} pauses over 20 ms")
    for test, generation, took in sorted(pauses, key=lambda p: -p[2])[:15]:
        print(f"  gc pause {1000 * took:6.0f} ms  gen {generation}  {test}")
    print("\n  wall s   CPU s  tests  file")
    for name, (wall, cpu, count) in sorted(by_file.items(), key=lambda item: -item[1][0])[:25]:
        print(f"{wall:8.1f} {cpu:7.1f} {count:6.0f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
