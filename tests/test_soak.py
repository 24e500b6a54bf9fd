"""``bench/soak.py`` end to end, on a tiny budget: ``callbridge serve`` in its own process, four calls one after
another per lane for 20 s with drops, barge-ins and key presses every few seconds; it must report nothing leaked and
no frame lost outside flushes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

SOAK = Path(__file__).parent.parent / "bench" / "soak.py"


@pytest.mark.long
def test_a_short_soak_leaks_nothing_and_loses_no_frame(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    command = [
        sys.executable, str(SOAK), "--calls", "4", "--minutes", "0.33", "--call-seconds", "5:9", "--ramp", "1",
        "--drop-every", "3", "--barge-in-every", "2", "--dtmf-every", "2", "--grace", "2", "--sample-every", "5",
        "--json", str(out),
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["calls_completed"] >= 8 and result["calls_failed"] == 0
    assert result["reconnects"] > 0 and result["barge_ins"] > 0 and result["frames_flushed"] > 0
    assert all(value == 0 for value in result["leaks"].values()), result["leaks"]
    assert result["frames_lost_outside_flushes"] == 0 and result["frames_duplicated"] == 0
    assert result["stream_ends_misread"] == 0 and result["streams_unmatched"] == 0
    assert result["frames_received"] > 0
    assert len(result["samples"]) >= 3
    assert "soak: OK" in run.stdout
