"""How a parallel run shares the machine's two cores between tests that keep real time and tests that do not.

The end-to-end tests run calls at real time (20 ms frames, timers of a few hundred ms); the rest of the suite (the
core tier, the fault simulator's virtual clock, the fuzzers, the command line's mistakes) is CPU work with no clock
to keep. On a slow machine twelve workers keep both cores busy from start to end (session 40: 527 s of wall time,
all of it CPU-bound), and a real-time test then measures the machine, not the bridge: a reply late by seconds, a
worker started too slowly to take its SIGTERM. Two rules, both outside the tests themselves:

- ``background`` (and ``core``) tests run at a lower CPU priority (``nice`` 5: a third of a nice-0 process's share of
  a busy core, restored after the test), so that the real-time tests beside them are served first. Raising the
  priority back needs root (CAP_SYS_NICE): where the run is not root (a laptop, fast enough not to need it) nothing
  is changed. Served last, a ``background`` test's wall time is what the real-time tests leave it: its hang guard is
  ``BACKGROUND_TIMEOUT_S``, not the suite's 120 s (at nice 10, two of the fault simulator's seeds ran past 120 s in a
  CI run beside a busy machine).
- ``processes`` tests (a fleet, a worker group behind a load balancer, vllm-omni's own serving stack: several
  processes carrying calls at real time, most of a core each while they run) take one of ``PROCESS_SLOTS`` slots,
  file locks shared by the run's workers, before they start: at most that many at once, however the schedule falls.
  (Every real-time test behind eight such slots was tried too: the run took 575 s where it took 495, and a test of
  vllm-omni's own server still came late.)

A real-time test that fails is run once more, at once, in its worker (``pytest-rerunfailures``' ``flaky`` marker,
given here to every test that is neither ``core`` nor ``background``): on this project's slow 2-core machines (the
cores 98 % busy from the run's start to its end, ``bench/pytest_times.py``) each full run failed one to three of
the suite's real-time tests, a different one each time, each of which passed alone — a call's event loop starved
for most of a second (a reply late, a recording run 480 ms apart where 400 are allowed, a tool's filler said because
its answer took 1.3 s). A second failure fails the run; every rerun is listed in the run's summary (``-rR``, in
``addopts``) under "rerun test summary info", so a test that needs its second try is seen, not hidden. (It did
not hide a real bug: a BYE read before the caller's last RTP packets lost a digit in 9 of 10 SIPp calls, and that
test failed both tries.) The pure tests (``core``) and the virtual-clock and fuzzing ones (``background``) never get
a second try: nothing of theirs depends on the machine's speed.

And one rule for the heap each worker keeps: after every test, a full garbage collection and ``gc.freeze()`` (what
survived is moved out of the collector's view). A worker's heap grows over its hundreds of tests (the fuzzers'
examples, the tests' modules, what their fixtures keep), and a full collection walks all of it: measured with
``bench/pytest_times.py``, gen-2 pauses of 1 to 5 s, inside real-time tests too (a barge-in's flush, a recording
through stalls, an outbound call, a drain: 1.0 to 2.3 s), and 6 to 65 s of a worker's time in the collector. Frozen, a
collection walks only what the running test made, and the one between tests is no test's stall.
"""

from __future__ import annotations

import fcntl
import gc
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import pytest

__all__ = [
    "BACKGROUND_NICE",
    "BACKGROUND_TIMEOUT_S",
    "PROCESS_SLOTS",
    "REAL_TIME_RERUNS",
    "give_background_tests_time",
    "rerun_real_time_tests",
    "sharing_the_cpu",
]

BACKGROUND_NICE: Final = 5
BACKGROUND_TIMEOUT_S: Final = 600
PROCESS_SLOTS: Final = 3
REAL_TIME_RERUNS: Final = 1
_SLOT_POLL_S: Final = 0.1


def give_background_tests_time(items: list[pytest.Item]) -> None:
    """Each ``background`` test without a timeout of its own gets ``BACKGROUND_TIMEOUT_S`` (see the module
    docstring)."""
    for item in items:
        if item.get_closest_marker("background") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(BACKGROUND_TIMEOUT_S))


def rerun_real_time_tests(items: list[pytest.Item]) -> None:
    """Each test that keeps real time (neither ``core`` nor ``background``) and has no ``flaky`` marker of its own
    gets ``REAL_TIME_RERUNS`` (see the module docstring)."""
    for item in items:
        if not _is_background(item) and item.get_closest_marker("flaky") is None:
            item.add_marker(pytest.mark.flaky(reruns=REAL_TIME_RERUNS))


def _is_background(item: pytest.Item) -> bool:
    return item.get_closest_marker("background") is not None or item.get_closest_marker("core") is not None


def _can_renice() -> bool:
    """Whether a thread may lower its nice value again (root): only then is a test's priority changed."""
    return hasattr(os, "setpriority") and os.geteuid() == 0


def _take_slot(folder: Path, kind: str, slots: int) -> int:
    """Wait for one of the run's ``slots`` slots of ``kind``; the file descriptor holding its lock."""
    folder.mkdir(exist_ok=True)
    while True:
        for index in range(slots):
            fd = os.open(folder / f"{kind}-{index}", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        time.sleep(_SLOT_POLL_S)


def _slots_folder(item: pytest.Item) -> Path | None:
    """The run's slot files (one folder per parallel run); None outside xdist's workers: one test at a time."""
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None:
        return None
    return Path(tempfile.gettempdir()) / f"callbridge-process-slots-{workerinput['testrunuid']}"


@contextmanager
def sharing_the_cpu(item: pytest.Item) -> Iterator[None]:
    """Around one test's whole protocol (its fixtures too, and before its timeout starts: ``tests/conftest.py``'s
    outermost ``pytest_runtest_protocol`` wrapper): its slot and its priority."""
    folder = _slots_folder(item)
    background = _is_background(item)
    slots: list[int] = []
    if folder is not None and item.get_closest_marker("processes") is not None:
        slots.append(_take_slot(folder, "processes", PROCESS_SLOTS))
    reniced = background and _can_renice()
    if reniced:
        os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)  # this thread: the test's
    try:
        yield
    finally:
        if reniced:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        for slot in slots:
            os.close(slot)  # closing the descriptor releases its lock
        gc.collect()
        gc.freeze()
