"""Where the suite's time goes: each test's wall time and CPU time (its process's, and its reaped children's: the
servers it started), by file and by xdist worker. A pytest plugin, then a summary.

    PYTHONPATH=bench .venv/bin/python -m pytest -p pytest_times     # writes .cache/pytest_times/<worker>.json
    python bench/pytest_times.py                                      # the summary of the last run

The wall time of a test is what it waited (most end-to-end tests wait at real time); its CPU is what it cost the
machine's two cores. Their sums, against the run's wall time and its workers, say whether more workers would help
(the tests wait) or not (the cores are busy).
"""

from __future__ import annotations

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


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Generator[None, None, None]:
    cpu, wall = _cpu_s(), time.monotonic()
    yield
    _rows.append((item.nodeid, _cpu_s() - cpu, time.monotonic() - wall))


def pytest_sessionfinish(session: Any) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json").write_text(json.dumps(_rows))


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
    print("\n  wall s   CPU s  tests  file")
    for name, (wall, cpu, count) in sorted(by_file.items(), key=lambda item: -item[1][0])[:25]:
        print(f"{wall:8.1f} {cpu:7.1f} {count:6.0f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
