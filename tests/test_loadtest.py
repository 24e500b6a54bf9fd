"""The load tester against real bridges over loopback, for every carrier: it measures, and loses nothing.

In-process bridges (``running_bridge``) for each carrier's clicks run, a barge-in run and drops; and one
``callbridge serve`` in its own process configured from ``--print-env`` (Telnyx: its answer needs the simulated
Call Control API, served by the load tester).
"""

from __future__ import annotations

import asyncio
import audioop
import contextlib
import os
import shlex
import shutil
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from callbridge.cli import main
from callbridge.config import Settings, load_settings
from callbridge.outbound_http import http_client
from callbridge.sim.loadtest import (
    LOAD_TEST_BARGE_IN,
    LoadTest,
    LoadTestOptions,
    bridge_env,
    caller_frames,
    report_json,
    run_load_test,
    secret_from_settings,
)
from callbridge.sim.ports import free_port
from callbridge.sim.runner import load_wav_8k, running_bridge, sample_caller_wav
from callbridge.sim.simulators import simulated
from tests.bridge.twilio_e2e import until

pytestmark = pytest.mark.hot_path
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""

SIMULATED = simulated()

SPEECH = load_wav_8k(sample_caller_wav())


def _settings(agent: str = "loopback") -> Settings:
    return Settings.model_validate({"local_engine": {"agent": agent}, "barge_in": LOAD_TEST_BARGE_IN})


@pytest.mark.parametrize("provider", sorted(SIMULATED))
async def test_a_short_load_run(provider: str) -> None:
    async with running_bridge(_settings(), provider=provider) as bridge:
        options = LoadTestOptions(
            calls=3, ramp_s=0.3, duration_s=3.0, click_every_ms=500, audio=SPEECH, server_pid=os.getpid(), progress=False,
            metrics_url=bridge.base_url,
        )  # fmt: skip
        report = await LoadTest(bridge.carrier, options).run()
    assert report.failed_calls == 0 and report.failures == [], report.render()
    assert report.protocol_warnings == 0, report.warnings
    assert report.provider == provider and report.frames_sent == 3 * 150
    assert report.clicks_sent == 18 and report.clicks_returned >= 18 - 3, report.render()  # the last may be in flight
    assert set(report.round_trip_ms) == {"p50", "p95", "p99", "max"}
    # Exotel moves 100 ms (in) and 200 ms (out) chunks: its round trip is a few hundred ms by protocol
    bound_ms = 800 if provider == "exotel" else 300
    # bridge and generator share this process: a starved event loop (a busy test machine) delays both, by about
    # what the generator's timer was late
    stall_ms = report.generator_tick_lag_ms["max"]
    assert 0 < report.round_trip_ms["p50"] <= report.round_trip_ms["max"] < bound_ms + stall_ms, report.render()
    assert report.round_trip_ms["p50"] <= report.heard_round_trip_ms["p50"] < bound_ms + 200 + stall_ms
    # the tail of each call in flight: 400 ms, and what a starved loop held back as the calls hung up
    assert report.frames_received >= report.frames_sent - 3 * (20 + int(stall_ms) // 20), report.render()
    assert report.first_audio_ms["max"] < bound_ms + stall_ms
    assert report.server_cpu_ms_per_call_second is not None and report.server_cpu_ms_per_call_second > 0
    # each stream's first caller audio reached the engine (from the bridge's own metrics, scraped around the run)
    first = report.first_audio_to_engine_ms
    assert first["streams"] == 3 and first["p50_le"] <= first["p99_le"], report.render()
    assert b'"round_trip_ms"' in report_json(report) and "clicks:" in report.render() and "handed to the engine" in report.render()


async def test_phases_spread_the_calls_clocks_and_keep_each_call_at_20_ms() -> None:
    """``--phases 4``: the calls' frames go out on four instants 5 ms apart (calls 0..3 one each), not all at once;
    each call still sends one frame every 20 ms."""
    async with running_bridge(_settings(), provider="twilio") as bridge:
        options = LoadTestOptions(calls=4, ramp_s=0.2, duration_s=2.0, click_every_ms=200, progress=False, phases=4)
        samples = await LoadTest(bridge.carrier, options).run_samples()
    report = samples.report()
    assert report.failed_calls == 0 and report.frames_sent == 4 * 100, report.render()
    assert report.clicks_returned >= report.clicks_sent - 4, report.render()
    slots = {int(at_s * 1000 % 20 // 5) for at_s in samples.click_at_s}  # where in its 20 ms each click went out
    assert len(slots) >= 3, sorted(at_s * 1000 % 20 for at_s in samples.click_at_s)


async def test_calls_past_the_bridges_capacity_are_counted_refused_with_the_time_of_the_no() -> None:
    """Admission past ``server.max_calls``: the load test tells the calls the bridge refused at the answer (busy) from
    those it answered, with how long each answer took; the answered ones run whole."""
    settings = Settings.model_validate({"local_engine": {"agent": "loopback"}, "server": {"max_calls": 2}, "barge_in": LOAD_TEST_BARGE_IN})
    async with running_bridge(settings) as bridge:
        options = LoadTestOptions(calls=4, ramp_s=0.3, duration_s=2.0, click_every_ms=500, audio=SPEECH, progress=False)
        report = await LoadTest(bridge.carrier, options).run()
    assert report.refused_calls == 2 and report.failed_calls == 2, report.render()
    assert all("<Reject>" in failure for failure in report.failures), report.failures
    assert report.frames_sent == 2 * 100 and report.clicks_returned >= 6, report.render()  # the two answered run whole
    assert 0 < report.refused_answer_ms["max"] < 5000 and 0 < report.answer_ms["p50"] < 5000, report.render()
    assert "2 of them refused at the answer" in report.render() and "the bridge's no" in report.render()


@pytest.mark.parametrize("provider", ["twilio", "sip"])
async def test_placed_calls_under_load_keep_the_carriers_rate(provider: str) -> None:
    """``--outbound``: five calls asked for at once (a 0.1 s ramp), the bridge dials them at
    ``outbound.calls_per_second`` 4 — a queue, not a burst: the dials span a second or so (four intervals of 262.5
    ms; at least three here, what a request late on its way can take off, a lower bound a loaded machine only
    lengthens) — and each answered call carries the media as an inbound one (its clicks come back). Through Twilio's
    REST dial, and through the SIP trunk (the simulated trunk's called side answering the bridge's INVITEs)."""
    outbound = {"api_token": "load-test-token-0123", "calls_per_second": 4.0}
    settings = Settings.model_validate({"local_engine": {"agent": "loopback"}, "barge_in": LOAD_TEST_BARGE_IN, "outbound": outbound})
    async with running_bridge(settings, provider=provider) as bridge:
        options = LoadTestOptions(calls=5, ramp_s=0.1, duration_s=1.5, click_every_ms=500, audio=SPEECH, progress=False, outbound_token="load-test-token-0123")
        report = await LoadTest(bridge.carrier, options).run()
    assert report.failed_calls == 0 and report.frames_sent == 5 * 75, report.render()
    assert report.dials == 5 and report.dials_min_gap_ms is not None, report.render()
    assert report.dials_span_s is not None and report.dials_span_s >= 0.75, report.render()
    assert report.clicks_returned >= report.clicks_sent - 5, report.render()
    assert "placed: 5 dials" in report.render()


def test_outbound_needs_a_bridge_here_and_a_carrier_that_dials(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", "--outbound", "--provider", "exotel", "--calls", "1"]) == 2
    assert "--outbound needs" in capsys.readouterr().err


@pytest.mark.parametrize("provider", ["twilio", "audiosocket", "sip"])
async def test_barge_ins_are_flushed(provider: str) -> None:
    """The echo agent says each utterance back; the caller talks over it, and the carrier's queue is flushed
    (AudioSocket and SIP have none: the agent's audio stops) where the caller stopped hearing it."""
    options = LoadTestOptions(calls=2, ramp_s=0.2, duration_s=7.0, audio=SPEECH[: 1500 * 16], barge_in_every_ms=2000, progress=False)
    report = await run_load_test(Settings(), provider, options, url=None, secret="", rest_url="")
    assert report.failed_calls == 0 and report.protocol_warnings == 0, report.render()
    assert report.clicks_sent == 0 and report.barge_ins >= 2, report.render()
    assert set(report.barge_in_flush_ms) == {"p50", "p95", "p99", "max"}
    # VAD has to hear speech first (Silero, 32 ms windows), then the flush crosses the websocket
    assert 20 < report.barge_in_flush_ms["p50"] < 1000, report.render()
    # the bridge truncated the reply where the caller stopped hearing it, within a frame (and a tick of jitter);
    # a generator stalled by a busy machine plays late, and echoes marks late, while the bridge's clock runs on
    error, slack_ms = report.heard_position_error_ms, 40 + report.generator_tick_lag_ms["max"]
    assert error and -slack_ms <= error["min"] <= error["max"] <= slack_ms, report.render()
    assert "barge-ins:" in report.render() and "heard-position error" in report.render()


@pytest.mark.parametrize("provider", sorted(p for p, sim in SIMULATED.items() if sim.can_reconnect))
async def test_drops_and_key_presses_under_load(provider: str) -> None:
    async with running_bridge(_settings(), provider=provider) as bridge:
        options = LoadTestOptions(
            calls=2, ramp_s=0.2, duration_s=3.0, click_every_ms=400, dtmf_every_ms=500, drop_every_ms=1200, progress=False,
        )  # fmt: skip
        report = await LoadTest(bridge.carrier, options).run()
        resumed = bridge.app.state.bridge.registry.get_sample_value("callbridge_engine_sessions_total", {"how": "resumed"})
    assert report.failed_calls == 0, report.failures
    assert report.reconnects == 4 and resumed == 4  # each drop came back on the same engine session
    assert report.clicks_returned >= 8 and report.protocol_warnings == 0, report.render()


def test_caller_audio_is_kept_below_the_click_level() -> None:
    frames = caller_frames(SPEECH)
    assert all(len(frame) == 320 for frame in frames)
    assert max(audioop.max(frame, 2) for frame in frames) <= 6000 < audioop.max(SPEECH, 2)
    assert frames[-50:] == [bytes(320)] * 50  # a pause after the utterance
    assert caller_frames(None) == [bytes(320)]


@pytest.mark.parametrize("workers", [1, 2])
async def test_against_a_separate_callbridge_serve(tmp_path: Path, workers: int) -> None:
    """``callbridge serve`` configured only by the env ``--print-env`` gives, and a Telnyx load test against it; with
    ``--workers 2`` (the supervisor's registry, the shipped default) the server's CPU and memory are its workers' too,
    not the supervisor's alone (which only watches them)."""
    await _load_test_a_separate_serve(tmp_path, workers)


async def _load_test_a_separate_serve(tmp_path: Path, workers: int) -> None:
    port, rest_port = free_port(), free_port()
    url, rest_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{rest_port}"
    secret = "loadtest-secret-0123456789"
    exported = dict(
        shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in bridge_env("telnyx", secret, rest_url).splitlines()
    )
    assert exported["CALLBRIDGE_TELNYX__API_KEY"] == secret and exported["CALLBRIDGE_TELNYX__API_BASE_URL"] == rest_url
    assert exported["CALLBRIDGE_BARGE_IN__MODE"] == "engine"  # the loopback sends back what it hears, clicks over it included
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CALLBRIDGE_")},
        **exported,
        "CALLBRIDGE_LOCAL_ENGINE__AGENT": "loopback",
        "CALLBRIDGE_SERVER__PUBLIC_URL": url,
    }
    log = (tmp_path / "serve.log").open("wb")
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callbridge", "serve", "--port", str(port), "--workers", str(workers), "--log-level", "warning",
        env=env, stdout=log, stderr=log,
    )  # fmt: skip
    supervisor = psutil.Process(server.pid)
    try:
        async with http_client() as http:

            async def up() -> bool:
                try:
                    return (await http.get(url + "/healthz")).status_code < 500
                except httpx.HTTPError:
                    return False

            await until(up, timeout_s=30)
        settings = Settings.model_validate({"telnyx": {"api_key": secret}})
        options = LoadTestOptions(calls=2, ramp_s=0.2, duration_s=2.0, click_every_ms=500, server_pid=server.pid, progress=False)
        own_before = sum(supervisor.cpu_times()[:2])
        report = await run_load_test(settings, "telnyx", options, url=url, secret=secret, rest_url=rest_url)
        own_ms = (sum(supervisor.cpu_times()[:2]) - own_before) * 1000
        processes = len(supervisor.children(recursive=True))
    finally:
        children = supervisor.children(recursive=True)  # the workers, in their own process group: not killed with it
        server.kill()  # uvicorn may sit out a plain SIGTERM while connections close
        await asyncio.wait_for(server.wait(), 10)
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        psutil.wait_procs(children, timeout=10)
        log.close()
    assert report.failed_calls == 0 and report.protocol_warnings == 0, (report.render(), (tmp_path / "serve.log").read_text())
    assert report.clicks_returned >= 6 and report.round_trip_ms["p50"] < 500, report.render()
    assert report.server_cpu_ms_per_call_second is not None and report.server_rss_mb is not None and report.server_rss_mb > 10
    if workers > 1:  # the two workers carried the calls: their CPU and memory are counted, beside the supervisor's
        assert processes >= workers, processes
        server_ms = report.server_cpu_ms_per_call_second * report.frames_sent * 20 / 1000
        assert server_ms > 2 * own_ms + 10, (server_ms, own_ms)
        assert report.server_rss_mb > workers * 40, report.server_rss_mb


@pytest.mark.parametrize("provider", sorted(SIMULATED))
def test_print_env_configures_a_bridge_for_the_simulated_account(
    provider: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``--print-env`` prints is valid configuration, and it holds the secret the load tester signs with."""
    assert main(["loadtest", "--provider", provider, "--secret", "s3cret-0123456789abcdef", "--rest-port", "8111", "--print-env"]) == 0
    printed = capsys.readouterr().out
    for line in printed.splitlines():
        assert line.startswith((f"export CALLBRIDGE_{provider.upper()}__", "export CALLBRIDGE_BARGE_IN__MODE=engine")), line
        key, _, value = line.removeprefix("export ").partition("=")
        monkeypatch.setenv(key, shlex.split(value)[0])
    settings = load_settings()
    assert secret_from_settings(provider, settings) == ("" if provider == "audiosocket" else "s3cret-0123456789abcdef")
    overrides = SIMULATED[provider].bridge_settings("s3cret-0123456789abcdef", "http://127.0.0.1:8111")
    section = getattr(settings, provider)
    for key, value in overrides[provider].items():
        if key in ("private_key_path", "port"):  # a fresh key pair and a free port each time
            continue
        configured = getattr(section, key)
        if isinstance(value, dict):  # a nested section (``sip.outbound``)
            assert {k: getattr(configured, k) for k in value} == value, key
            continue
        assert (configured.get_secret_value() if hasattr(configured, "get_secret_value") else configured) == value, key
    if provider == "vonage":
        key_path = settings.vonage.private_key_path
        assert key_path is not None and key_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY")
        shutil.rmtree(key_path.parent)
