"""The load tester against a real bridge (loopback agent) over loopback: it measures, and loses nothing."""

from __future__ import annotations

from callbridge.config import Settings
from callbridge.sim.loadtest import LoadTest, LoadTestOptions, report_json
from callbridge.sim.runner import running_bridge


async def test_a_short_load_run() -> None:
    settings = Settings.model_validate({"local_engine": {"agent": "loopback"}})
    async with running_bridge(settings) as bridge:
        token = bridge.settings.twilio.auth_token.get_secret_value()  # type: ignore[union-attr]
        options = LoadTestOptions(bridge.base_url, token, calls=3, ramp_s=0.3, duration_s=2.5, click_every_ms=500, progress=False)
        report = await LoadTest(options).run()
    assert report.failed_calls == 0 and report.failures == []
    assert report.clicks_sent >= 12 and report.clicks_returned >= report.clicks_sent - 3  # the last may be in flight
    assert set(report.round_trip_ms) == {"p50", "p95", "p99", "max"} and report.round_trip_ms["p50"] > 0
    assert report.frames_received >= report.frames_sent - 3 * 15
    assert b'"round_trip_ms"' in report_json(report)
    assert "clicks:" in report.render()


async def test_drops_and_key_presses_under_load() -> None:
    settings = Settings.model_validate({"local_engine": {"agent": "loopback"}})
    async with running_bridge(settings) as bridge:
        token = bridge.settings.twilio.auth_token.get_secret_value()  # type: ignore[union-attr]
        options = LoadTestOptions(
            bridge.base_url, token, calls=2, ramp_s=0.2, duration_s=3.0, click_every_ms=400,
            dtmf_every_ms=500, drop_every_ms=1200, progress=False,
        )  # fmt: skip
        report = await LoadTest(options).run()
        resumed = bridge.app.state.bridge.registry.get_sample_value("callbridge_engine_sessions_total", {"how": "resumed"})
    assert report.failed_calls == 0, report.failures
    assert report.reconnects == 4 and resumed == 4  # each drop came back on the same engine session
    assert report.clicks_returned >= 8
