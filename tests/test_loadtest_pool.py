"""``callbridge loadtest --processes N`` and ``--png``: the merge of several generator processes' raw samples, the
REST API they share, a real run in two processes against ``callbridge serve``, and the PNG (or, without
matplotlib, a clear refusal)."""

from __future__ import annotations

import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from callbridge.cli import main
from callbridge.sim.loadtest import (
    CallSamples,
    LoadSamples,
    bridge_env,
    merge_samples,
    shard_of,
)
from callbridge.sim.loadtest_plot import per_second, write_png
from callbridge.sim.loadtest_pool import _RestRouter, processes_for, shareable_problem
from callbridge.sim.ports import free_port
from callbridge.sim.simulators import simulated

pytestmark = pytest.mark.processes

SIMULATED = simulated()


def _call(index: int, up_from_s: float, frames: int, clicks: int, *, failed: str | None = None) -> CallSamples:
    return CallSamples(
        index=index, up_from_s=up_from_s, up_until_s=up_from_s + frames * 0.02, frames_sent=frames, frames_received=frames - 1,
        clicks_sent=clicks, clicks_returned=clicks - 1, reconnects=1, barge_ins=0, first_audio_ms=20.0 + index, failed=failed,
        warnings=("late mark",) if failed else (),
    )  # fmt: skip


def _samples(started: float, calls: list[CallSamples], round_trips: list[float], at_s: list[float], lags: list[float]) -> LoadSamples:
    return LoadSamples(
        provider="twilio", calls_planned=len(calls), started=started, duration_s=4.0, calls=calls,
        round_trip_ms=round_trips, heard_round_trip_ms=[v + 5 for v in round_trips], click_at_s=at_s,
        barge_in_flush_ms=[], barge_in_at_s=[], heard_position_error_ms=[], tick_lag_ms=lags, generator_cpu_ms=100.0,
    )  # fmt: skip


def test_merged_samples_are_summed_and_their_percentiles_are_over_all_samples() -> None:
    # a quiet process (100 round trips of 10 ms) and a loaded one (100 of 10 ms, 5 of 900 ms): the merged p99 is
    # the 99th percentile of the 205 samples, not the mean of the two processes' p99s (10 and 900)
    quiet = _samples(100.0, [_call(0, 0.1, 200, 4), _call(2, 0.5, 200, 4)], [10.0] * 100, [0.5] * 100, [0.1] * 50)
    loaded = _samples(
        100.5, [_call(1, 0.0, 150, 3, failed="the bridge hung up")], [10.0] * 100 + [900.0] * 5, [0.2] * 100 + [3.2] * 5, [7.0] * 50
    )
    merged = merge_samples([quiet, loaded])
    report = merged.report()
    everything = sorted(quiet.round_trip_ms + loaded.round_trip_ms)
    assert report.round_trip_ms == {"p50": 10.0, "p95": 10.0, "p99": 900.0, "max": 900.0} != quiet.report().round_trip_ms
    assert report.round_trip_ms["p99"] == everything[int(len(everything) * 0.99)]
    assert (quiet.report().round_trip_ms["p99"] + loaded.report().round_trip_ms["p99"]) / 2 == 455.0  # what averaging gives
    assert report.heard_round_trip_ms["p50"] == 15.0
    assert report.generator_tick_lag_ms["p50"] == statistics.median([0.1] * 50 + [7.0] * 50)
    assert [c.index for c in merged.calls] == [0, 1, 2] and report.calls == 3 and merged.processes == 2
    assert report.frames_sent == 550 and report.frames_received == 547
    assert report.clicks_sent == 11 and report.clicks_returned == 8 and report.reconnects == 3
    assert report.failed_calls == 1 and report.failures == ["call 1: the bridge hung up"]
    assert report.warnings == ["call 1: late mark"] and report.protocol_warnings == 1
    assert report.first_audio_ms["max"] == 22.0 and report.generator_processes == 2
    assert report.generator_cpu_ms_per_call_second == pytest.approx(200.0 / 11.0)  # summed CPU / 11 call-seconds
    # times re-based on the earliest start: the loaded process started 0.5 s later
    assert merged.started == 100.0 and merged.duration_s == 4.5
    assert sorted(set(merged.click_at_s)) == [0.5, 0.7, 3.7]
    assert merged.calls[1].up_from_s == 0.5
    rows = per_second(merged)
    assert [row.count for row in rows[:4]] == [200, 0, 0, 5] and rows[0].p50 == 10.0 and rows[3].p99 == 900.0
    assert [row.calls_up for row in rows[:5]] == [3, 3, 3, 2, 0]
    with pytest.raises(ValueError):
        merge_samples([])


@pytest.mark.parametrize("provider", sorted(SIMULATED))
async def test_every_carrier_can_share_its_rest_api_across_processes(provider: str) -> None:
    """The parent serves the REST API; a request about a call goes to the process whose call ids hash to it."""
    carrier = SIMULATED[provider]("http://127.0.0.1:1", "s3cret-0123456789abcdef")
    try:
        assert shareable_problem(carrier) is None
        router = _RestRouter(carrier.rest_routes(), 3, carrier.stateless_rest_paths)
        paths = {
            "bandwidth": "/api/v2/accounts/9900001/calls/{call}",
            "twilio": "/2010-04-01/Accounts/AC1/Calls/{call}.json",
            "signalwire": "/api/laml/2010-04-01/Accounts/AC1/Calls/{call}.json",
            "telnyx": "/v2/calls/{call}/actions/hangup",
            "plivo": "/v1/Account/MA1/Call/{call}/",
            "vonage": "/v1/calls/{call}",
            "jambonz": "/v1/Accounts/9351f46a-678c-43f5-b8a6-d4eb58d131af/Calls/{call}",
        }
        methods = {"twilio": "POST", "signalwire": "POST", "telnyx": "POST", "plivo": "DELETE", "vonage": "PUT", "bandwidth": "POST", "jambonz": "PUT"}
        if provider in paths:
            for _ in range(20):
                call_id = carrier.new_call_id()
                assert router.shard_for(methods[provider], paths[provider].format(call=call_id)) == shard_of(call_id, 3)
            assert router.shard_for("GET", "/nothing/here") is None
            for path in carrier.stateless_rest_paths:  # an OAuth token: any process answers it alike
                assert router.shard_for("POST", path) == 0
        else:
            assert carrier.rest_routes() == []  # the bridge calls nothing back: nothing to share
        await router.aclose()
    finally:
        await carrier.aclose()


def test_auto_processes() -> None:
    cpus = os.cpu_count() or 1
    assert processes_for(10, None) == 1 and processes_for(120, None) == 1
    assert processes_for(121, None) == min(2, cpus) and processes_for(100_000, None) == cpus
    assert processes_for(3, 8) == 3 and processes_for(500, 4) == 4


def test_several_processes_against_a_separate_callbridge_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--processes 2`` against ``callbridge serve`` (Telnyx: every call is answered through the REST API the
    parent serves and forwards to the right process); the merged report and the PNG."""
    port, rest_port = free_port(), free_port()
    url, secret = f"http://127.0.0.1:{port}", "loadtest-secret-0123456789"
    for key in [k for k in os.environ if k.startswith("CALLBRIDGE_")]:
        monkeypatch.delenv(key)  # the load tester reads its configuration too
    exported = bridge_env("telnyx", secret, f"http://127.0.0.1:{rest_port}")
    env = {
        **os.environ,
        **dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in exported.splitlines()),
        "CALLBRIDGE_LOCAL_ENGINE__AGENT": "loopback",
        "CALLBRIDGE_SERVER__PUBLIC_URL": url,
    }
    log = (tmp_path / "serve.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "callbridge", "serve", "--port", str(port), "--log-level", "warning"], env=env, stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/healthz").status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        report_path, png = tmp_path / "report.json", tmp_path / "latency.png"
        args = ["loadtest", "--provider", "telnyx", "--url", url, "--secret", secret, "--rest-port", str(rest_port)]
        args += ["--calls", "4", "--ramp", "0.3", "--duration", "2", "--click-every", "0.5", "--processes", "2"]
        args += ["--server-pid", str(server.pid), "--json", str(report_path), "--png", str(png)]
        code = main(args)
    finally:
        server.kill()
        server.wait(10)
        log.close()
    report = json.loads(report_path.read_text())
    assert code == 0 and report["failed_calls"] == 0 and report["protocol_warnings"] == 0, (report, (tmp_path / "serve.log").read_text())
    assert report["calls"] == 4 and report["generator_processes"] == 2
    assert report["frames_sent"] == 4 * 100 and report["clicks_sent"] == 4 * 4
    assert report["clicks_returned"] >= 4 * 4 - 4 and set(report["round_trip_ms"]) == {"p50", "p95", "p99", "max"}
    assert report["server_cpu_ms_per_call_second"] > 0 and report["server_rss_mb"] > 10
    assert report["generator_tick_lag_ms"] and report["generator_cpu_ms_per_call_second"] > 0
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_png_of_a_barge_in_run_and_of_no_samples(tmp_path: Path) -> None:
    samples = LoadSamples(
        provider="twilio", calls_planned=1, started=0.0, duration_s=3.0, calls=[_call(0, 0.0, 150, 0)], round_trip_ms=[],
        heard_round_trip_ms=[], click_at_s=[], barge_in_flush_ms=[180.0, 240.0], barge_in_at_s=[0.4, 2.1],
        heard_position_error_ms=[4.0], tick_lag_ms=[0.2], generator_cpu_ms=10.0,
    )  # fmt: skip
    assert [(row.second, row.count, row.p50) for row in per_second(samples) if row.count] == [(0, 1, 180.0), (2, 1, 240.0)]
    write_png(samples, tmp_path / "barge.png")
    write_png(_samples(0.0, [], [], [], []), tmp_path / "empty.png")
    for name in ("barge.png", "empty.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


def test_png_without_matplotlib_is_refused_up_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    code = main(["loadtest", "--calls", "1", "--png", str(tmp_path / "out.png")])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'callbridge[plot]'" in err and "Traceback" not in err
    assert not (tmp_path / "out.png").exists()


def test_several_processes_need_a_separate_bridge(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", "--calls", "4", "--processes", "2"]) == 2
    assert "--processes needs --url" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["loadtest", "--processes", "0"])
    assert exit_.value.code == 2


def test_a_taken_rest_port_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken, socket.socket() as bridge:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        bridge.bind(("127.0.0.1", 0))
        bridge.listen()  # something answers at --url (loadtest checks before it starts)
        url = f"http://127.0.0.1:{bridge.getsockname()[1]}"
        args = ["loadtest", "--provider", "telnyx", "--url", url, "--secret", "s", "--rest-port", str(port)]
        assert main([*args, "--calls", "2", "--processes", "2"]) == 1
    assert f"cannot listen on 127.0.0.1:{port} (--rest-port)" in capsys.readouterr().err
