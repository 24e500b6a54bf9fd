"""What an operator reads (issue #16): ``callbridge serve``'s log in the format and at the level it was given from
its first line; a refused signature that says which URL it was checked against (the usual cause of a mismatch
is a ``server.public_url`` that is not the URL the carrier signed); the digits callers press, counted."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

from twilio.request_validator import RequestValidator
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from callbridge.carriers.twilio.sim import SimulatedTwilio
from callbridge.outbound_http import http_client
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import free_port
from tests.bridge.lone_bridge import served
from tests.bridge.test_fleet import SECRET, _start
from tests.conftest import wait_http_ok


async def test_the_log_is_in_its_format_and_level_from_the_first_line(tmp_path: Path) -> None:
    lines = [f"[{section}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in values.items())
             for section, values in SimulatedTwilio.bridge_settings(SECRET, "http://127.0.0.1:9").items()]  # fmt: skip
    config = tmp_path / "callbridge.toml"
    config.write_text("\n".join(lines) + "\n")
    bridge = _start("bridge", ["serve", "--log-level", "warning"], config, free_port(), tmp_path)
    try:
        await asyncio.to_thread(wait_http_ok, bridge.url + "/readyz", bridge.process, 60)  # type: ignore[arg-type]
        async with http_client(timeout=5) as http:  # one warning to read
            assert (await http.post(bridge.url + "/twilio/voice", data={"CallSid": "CA1"})).status_code == 403
    finally:
        bridge.stop()
    # before, the app's start-up lines (carrier_not_configured, at info) came out in console format, whatever the flags
    records = [json.loads(line) for line in bridge.log_path.read_text().splitlines() if line.strip()]  # each one JSON
    assert [r["event"] for r in records if r["event"] == "signature_invalid"] == ["signature_invalid"], records
    assert all(record["level"] in ("warning", "error", "critical") for record in records), records


async def test_a_refused_signature_names_the_url_it_was_checked_against(tmp_path: Path) -> None:
    async with served(tmp_path) as server:
        async with http_client(timeout=5) as http:
            refused = await http.post(server.bridge.url + "/twilio/voice?redirect=00", data={"CallSid": "CA1"},
                                      headers={"X-Twilio-Signature": "forged"})  # fmt: skip
        records = [json.loads(line) for line in server.bridge.log_path.read_text().splitlines() if line.startswith("{")]
    assert refused.status_code == 403
    [line] = [r for r in records if r["event"] == "signature_invalid"]
    assert line["url_checked"] == server.bridge.url + "/twilio/voice?redirect=00" and "forged" not in json.dumps(line)


async def test_a_digit_the_caller_pressed_is_counted_and_logged_without_its_value(tmp_path: Path) -> None:
    """Before, a received digit left no trace an operator could see (no log line, no metric)."""
    async with served(tmp_path) as server:
        result = await server.twilio.place_call(CallerScript(dtmf=((300, "7"), (600, "#")), hangup_at_ms=1500))
        async with http_client(timeout=5) as http:
            metrics = (await http.get(server.bridge.url + "/metrics")).text
        records = [json.loads(line) for line in server.bridge.log_path.read_text().splitlines() if line.startswith("{")]
    assert result.hung_up_by == "caller", result.render()
    assert 'callbridge_dtmf_received_total{provider="twilio"} 2.0' in metrics
    lines = [r for r in records if r["event"] == "dtmf_received"]
    assert len(lines) == 2 and all("digit" not in line for line in lines)  # callers key in PINs and card numbers


async def test_a_sender_that_reconnects_at_once_after_each_refusal_writes_a_bounded_log(tmp_path: Path) -> None:
    """#40: 300 refused streams for one call (a Twilio-protocol sender whose own TwiML carries no callbridge token,
    signed, reconnecting at once): every refusal counted, a handful of lines. Before: two lines an attempt."""
    async with served(tmp_path) as server:
        url = server.bridge.url.replace("http://", "ws://") + "/twilio/media"
        signature = RequestValidator(SECRET).compute_signature(url, {})
        call_sid = "CA" + "7" * 32
        start = {"event": "start", "streamSid": "MZ" + "1" * 32, "start": {
            "streamSid": "MZ" + "1" * 32, "accountSid": server.twilio.account_sid, "callSid": call_sid, "tracks": ["inbound"],
            "customParameters": {}, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}  # fmt: skip
        for _ in range(300):
            async with connect(url, additional_headers={"X-Twilio-Signature": signature}) as ws:
                await ws.send('{"event":"connected","protocol":"Call","version":"1.0.0"}')
                await ws.send(json.dumps(start))
                with contextlib.suppress(ConnectionClosed):
                    async for _ in ws:
                        pass
        async with http_client(timeout=5) as http:
            metrics = (await http.get(server.bridge.url + "/metrics")).text
        records = [json.loads(line) for line in server.bridge.log_path.read_text().splitlines() if line.startswith("{")]
    assert 'callbridge_streams_refused_total{provider="twilio",reason="bad_token"} 300.0' in metrics
    about_it = [r for r in records if r.get("call_id") == call_sid]
    assert 1 <= len(about_it) <= 10, [r["event"] for r in about_it]
