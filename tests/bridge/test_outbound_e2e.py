"""Calls the agent places (#42), end to end: ``POST /calls`` on the real server, the simulated Twilio's REST dial
(checked as Twilio's API checks it), its signed status callbacks and answer webhook, the callee's media — and what
the application hears of it all."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson
import pytest
from twilio.request_validator import RequestValidator

from callbridge.application.events import CallReport
from callbridge.carriers.twilio.sim import SimulatedTwilio
from callbridge.cli import main
from callbridge.engine.commands import CreateTextItem
from callbridge.outbound import DialAccepted, DialRefusal, DialRequest
from callbridge.outbound_http import http_client
from callbridge.sim.callee import Callee
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import RunningBridge, running_bridge
from tests.bridge import agent_app
from tests.bridge.twilio_e2e import engine, settings, short_speech, until

TOKEN = "outbound-token-0123456789"
CALLEE = "+15005550123"
OURS = "+15005550006"


def outbound_settings(**sections: dict[str, Any]) -> Any:
    app = sections.pop("app", {"module": "tests.bridge.agent_app:CallsOut"})
    return settings(app=app, outbound={"api_token": TOKEN, **sections.pop("outbound", {})}, **sections)


async def post_call(bridge: RunningBridge, body: object, *, token: str | None = TOKEN, raw: bytes | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with http_client(timeout=5.0) as http:
        if raw is not None:
            return await http.post(f"{bridge.base_url}/calls", content=raw, headers={**headers, "Content-Type": "application/json"})
        return await http.post(f"{bridge.base_url}/calls", json=body, headers=headers)


def events_of(dial_id: str) -> list[str]:
    return [event.type for call, event in agent_app.CallsOut.events if call.dial_id == dial_id]


@pytest.fixture(autouse=True)
def _fresh_app() -> None:
    agent_app.CallsOut.asked.clear()
    agent_app.CallsOut.events.clear()


DIALLING = ["signalwire", "twilio"]
"""The carriers whose calls the bridge places (their create-call API: the same request under each one's REST base)."""


@pytest.mark.parametrize("provider", DIALLING)
async def test_an_outbound_call_reaches_a_person_and_the_application_hears_it_go(provider: str) -> None:
    """``POST /calls`` answers at once with the dial id; Twilio is asked to call (its create-call API, basic auth,
    the answer URL naming the dial); the person answers after a ring and says hello; the application is asked for
    the assistant with direction outbound, and hears ``call.dialing``, ``call.ringing``, ``call.started``,
    ``call.answered`` … ``call.ended`` — each with the request's dial id and metadata — and the person hears the
    agent (the greeting, then the echo of their hello)."""
    recorder = engine()
    async with running_bridge(outbound_settings(), recorder, provider=provider) as bridge:
        carrier = bridge.carrier
        assert isinstance(carrier, SimulatedTwilio)
        carrier.callees[CALLEE] = Callee(ring_ms=300, script=CallerScript(utterances=((1500, short_speech(800)),), hangup_at_ms=4500))
        started = time.monotonic()
        response = await post_call(bridge, {"carrier": provider, "to": CALLEE, "from": OURS, "metadata": {"crm_id": 42, "campaign": "renewals"}})
        assert response.status_code == 202, response.text
        assert time.monotonic() - started < 1.0  # at once: the dial goes on behind it
        dial_id = response.json()["dial_id"]
        assert response.json()["status"] == "dialing"
        await until(lambda: len(carrier.dialled) == 1)
        ((call_sid, ringing),) = carrier.dialled.items()
        result = await ringing
        assert result is not None, carrier.status_reports
        await until(lambda: "call.ended" in events_of(dial_id), timeout_s=5)
    assert [status for sid, status in carrier.status_reports if sid == call_sid] == ["initiated", "ringing", "in-progress", "completed"]
    kinds = events_of(dial_id)
    assert kinds[:4] == ["call.dialing", "call.ringing", "call.started", "call.answered"], kinds
    assert kinds[-1] == "call.ended" and "call.failed" not in kinds, kinds
    for call, event in agent_app.CallsOut.events:
        assert (call.dial_id, call.metadata, call.direction) == (dial_id, {"crm_id": 42, "campaign": "renewals"}, "outbound"), event.type
        assert event.call_id == call_sid, event.type
    (asked,) = agent_app.CallsOut.asked
    assert (asked.direction, asked.called_number, asked.caller_number, asked.call_id) == ("outbound", CALLEE, OURS, call_sid)
    assert asked.ring_ms is not None and asked.ring_ms >= 250  # it rang 300 ms (a lower bound: load only lengthens it)
    report = CallReport.model_validate(agent_app.CallsOut.events[-1][1].data["report"])
    assert report.call.direction == "outbound" and report.call.dial_id == dial_id
    assert report.first_agent_audio_ms is not None  # the greeting
    assert result.agent_runs_ms, result.render()  # the person heard the agent
    (session_id,) = recorder.opened
    texts = [c.text for c in recorder.commands[session_id] if isinstance(c, CreateTextItem)]
    assert texts == [agent_app.GREETING], texts


async def test_a_request_that_names_its_assistant_is_not_asked_of_the_application() -> None:
    """The request's inline assistant is the call's: the application is not asked, and still hears the events."""
    recorder = engine()
    async with running_bridge(outbound_settings(), recorder) as bridge:
        assert isinstance(bridge.carrier, SimulatedTwilio)
        bridge.carrier.callees[CALLEE] = Callee(ring_ms=100, script=CallerScript(hangup_at_ms=1500))
        assistant = {"instructions": "You remind people of appointments.", "greeting": "Say you are calling from the clinic."}
        response = await post_call(bridge, {"carrier": "twilio", "to": CALLEE, "from": OURS, "assistant": assistant})
        assert response.status_code == 202, response.text
        dial_id = response.json()["dial_id"]
        await until(lambda: "call.ended" in events_of(dial_id), timeout_s=8)
    assert agent_app.CallsOut.asked == []
    (session_id,) = recorder.opened
    texts = [c.text for c in recorder.commands[session_id] if isinstance(c, CreateTextItem)]
    assert texts == ["Say you are calling from the clinic."], texts


@pytest.mark.parametrize("provider", DIALLING)
@pytest.mark.parametrize(("outcome", "status", "reason"), [("busy", "busy", "busy"), ("fails", "failed", "failed")])
async def test_a_call_nobody_answers_fails_with_its_reason_and_opens_no_session(outcome: str, status: str, reason: str, provider: str) -> None:
    """Busy, or a call the network fails: ``call.failed`` with the reason within 1 s of the carrier's report (its
    status callback), after ``call.dialing`` and ``call.ringing``; no engine session, the application never asked."""
    recorder = engine()
    async with running_bridge(outbound_settings(), recorder, provider=provider) as bridge:
        assert isinstance(bridge.carrier, SimulatedTwilio)
        bridge.carrier.callees[CALLEE] = Callee(outcome=outcome, ring_ms=200)  # type: ignore[arg-type]
        response = await post_call(bridge, {"carrier": provider, "to": CALLEE, "from": OURS})
        dial_id = response.json()["dial_id"]
        await until(lambda: "call.failed" in events_of(dial_id), timeout_s=5)
        reported_at = time.time()
        failed = next(event for call, event in agent_app.CallsOut.events if event.type == "call.failed")
    assert events_of(dial_id) == ["call.dialing", "call.ringing", "call.failed"]
    assert failed.data["reason"] == reason and status in failed.data["detail"], failed.data
    assert reported_at - failed.at < 1.0
    assert recorder.opened == [] and agent_app.CallsOut.asked == []


async def test_a_call_that_rings_out_fails_as_no_answer_at_its_ring_timeout() -> None:
    """Nobody picks up: Twilio gives up at the request's ``ring_timeout_s`` (its ``Timeout``) and says
    ``no-answer``; the application hears ``call.failed`` ``no_answer``."""
    async with running_bridge(outbound_settings(), engine()) as bridge:
        assert isinstance(bridge.carrier, SimulatedTwilio)
        bridge.carrier.callees[CALLEE] = Callee(outcome="no_answer")
        started = time.monotonic()
        response = await post_call(bridge, {"carrier": "twilio", "to": CALLEE, "from": OURS, "ring_timeout_s": 5})
        dial_id = response.json()["dial_id"]
        await until(lambda: "call.failed" in events_of(dial_id), timeout_s=10)
        failed = next(event for call, event in agent_app.CallsOut.events if event.type == "call.failed")
    assert failed.data["reason"] == "no_answer"
    assert 5.0 <= time.monotonic() - started < 7.0


async def test_calls_past_the_rate_wait_their_turn_and_past_the_queue_are_refused() -> None:
    """``outbound.calls_per_second`` 2, a queue of 2: of four requests at once the first is dialled, the next two
    wait (``queued``, how many before each) and are dialled 500 ms apart, the fourth is refused 429
    (``queue_full``)."""
    async with running_bridge(outbound_settings(outbound={"calls_per_second": 2.0, "max_queued": 2}), engine()) as bridge:
        carrier = bridge.carrier
        assert isinstance(carrier, SimulatedTwilio)
        rest = bridge.app.state.bridge.services.carrier_rests["twilio"]
        released: list[float] = []
        dial = rest.dial

        async def timed(leg: Any) -> str:  # when the pacer let each dial go (the network's delays are not the pacer's)
            released.append(time.monotonic())
            return await dial(leg)

        rest.dial = timed  # type: ignore[method-assign]
        for n in range(3):
            carrier.callees[f"+1500555020{n}"] = Callee(outcome="busy", ring_ms=50)
        answers = [await post_call(bridge, {"carrier": "twilio", "to": f"+1500555020{n}", "from": OURS}) for n in range(4)]
        assert [a.status_code for a in answers] == [202, 202, 202, 429], [a.text for a in answers]
        assert [a.json().get("status") for a in answers[:3]] == ["dialing", "queued", "queued"]
        assert [a.json().get("queued_behind") for a in answers[:3]] == [0, 1, 2]
        assert answers[3].json()["error"] == "queue_full"
        await until(lambda: sum(event.type == "call.dialing" for _, event in agent_app.CallsOut.events) == 3, timeout_s=5)
    assert len(released) == 3 and all(later - earlier >= 0.5 for earlier, later in zip(released, released[1:])), released


async def test_post_calls_refuses_what_it_should_before_it_dials() -> None:
    """No token configured: 403 for everyone. Configured: no or a wrong bearer token 401; then a body over 16 KiB
    413, not JSON 400, a number that is not E.164 400, a carrier that cannot dial 400, a voicemail with no message
    400 — each with its reason, and nothing dialled."""
    async with running_bridge(settings(), engine()) as bridge:
        response = await post_call(bridge, {"carrier": "twilio", "to": CALLEE, "from": OURS})
        assert (response.status_code, response.json()["error"]) == (403, "not_configured")
    async with running_bridge(outbound_settings(), engine()) as bridge:
        assert isinstance(bridge.carrier, SimulatedTwilio)
        good = {"carrier": "twilio", "to": CALLEE, "from": OURS}
        cases: list[tuple[httpx.Response, int, str]] = [
            (await post_call(bridge, good, token=None), 401, "unauthorized"),
            (await post_call(bridge, good, token="wrong-token-0123456789"), 401, "unauthorized"),
            (await post_call(bridge, None, raw=b'{"pad": "' + b"x" * 20_000 + b'"}'), 413, "too_large"),
            (await post_call(bridge, None, raw=b"{not json"), 400, "invalid_request"),
            (await post_call(bridge, {**good, "to": "5550123"}), 400, "invalid_request"),
            (await post_call(bridge, {**good, "carrier": "exotel"}), 400, "carrier_cannot_dial"),
            (await post_call(bridge, {**good, "machine_detection": "voicemail"}), 400, "invalid_request"),  # no message
            (await post_call(bridge, {**good, "surprise": 1}), 400, "invalid_request"),
        ]
        for response, status, reason in cases:
            assert (response.status_code, response.json()["error"]) == (status, reason), response.text
        assert bridge.carrier.dialled == {}


async def test_the_command_line_places_a_call_through_a_running_bridge(capsys: pytest.CaptureFixture[str]) -> None:
    """``callbridge call --to … --from … --carrier twilio``: the dial id printed, exit 0, the call dialled with the
    metadata given; without the token configured, exit 2 and why."""
    async with running_bridge(outbound_settings(), engine()) as bridge:
        assert isinstance(bridge.carrier, SimulatedTwilio)
        bridge.carrier.callees[CALLEE] = Callee(outcome="busy", ring_ms=50)
        argv = ["call", "--to", CALLEE, "--from", OURS, "--carrier", "twilio", "--metadata", "crm_id=42", "--bridge", bridge.base_url,
                "--set", f"outbound.api_token={TOKEN}"]  # fmt: skip
        assert await asyncio.to_thread(main, argv) == 0
        printed = orjson.loads(next(line for line in capsys.readouterr().out.splitlines() if line.startswith("{")))  # the logs aside
        assert printed["status"] == "dialing", printed
        await until(lambda: "call.failed" in events_of(printed["dial_id"]), timeout_s=5)
        assert all(call.metadata == {"crm_id": "42"} for call, _ in agent_app.CallsOut.events)
        assert await asyncio.to_thread(main, argv[:-2]) == 2
        assert "outbound.api_token is not set" in capsys.readouterr().err


async def test_a_python_application_places_calls_from_its_started_hook() -> None:
    """``app.module``: the application's ``started(calls)`` hook gets what places calls as the bridge starts;
    ``calls.place(DialRequest(…))`` is ``POST /calls`` without HTTP — taken, the call dialled and its events to the
    application's ``event`` hook; refused with the reason at once."""
    agent_app.PlacesCalls.calls = None
    async with running_bridge(outbound_settings(app={"module": "tests.bridge.agent_app:PlacesCalls"}), engine()) as bridge:
        assert isinstance(bridge.carrier, SimulatedTwilio)
        bridge.carrier.callees[CALLEE] = Callee(outcome="busy", ring_ms=50)
        calls = agent_app.PlacesCalls.calls
        assert calls is not None
        refused = calls.place(DialRequest.model_validate({"carrier": "exotel", "to": CALLEE, "from": OURS}))
        assert isinstance(refused, DialRefusal) and refused.reason == "carrier_cannot_dial"
        taken = calls.place(DialRequest.model_validate({"carrier": "twilio", "to": CALLEE, "from": OURS, "metadata": {"k": 1}}))
        assert isinstance(taken, DialAccepted), taken
        await until(lambda: "call.failed" in events_of(taken.dial_id), timeout_s=5)
    assert events_of(taken.dial_id) == ["call.dialing", "call.ringing", "call.failed"]
    assert all(call.metadata == {"k": 1} for call, _ in agent_app.CallsOut.events)


async def test_a_forged_or_replayed_status_callback_is_refused_and_reports_nothing() -> None:
    """``/twilio/call-status`` takes only what Twilio signed, once: unsigned, forged or replayed — 403, and the
    application hears nothing of it (a forger cannot fail someone's call)."""
    async with running_bridge(outbound_settings(), engine()) as bridge:
        carrier = bridge.carrier
        assert isinstance(carrier, SimulatedTwilio)
        carrier.callees[CALLEE] = Callee(outcome="no_answer")
        dial_id = (await post_call(bridge, {"carrier": "twilio", "to": CALLEE, "from": OURS, "ring_timeout_s": 30})).json()["dial_id"]
        await until(lambda: "call.ringing" in events_of(dial_id))
        (call_sid,) = carrier.dialled
        url = f"{bridge.base_url}/twilio/call-status"
        params = {"CallSid": call_sid, "AccountSid": carrier.account_sid, "CallStatus": "busy"}
        signed = {"X-Twilio-Signature": RequestValidator(carrier.auth_token).compute_signature(url, params)}
        async with http_client(timeout=5.0) as http:
            unsigned = await http.post(url, data=params)
            forged = await http.post(url, data=params, headers={"X-Twilio-Signature": "forged"})
            first = await http.post(url, data=params, headers=signed)
            replayed = await http.post(url, data=params, headers=signed)
        assert (unsigned.status_code, forged.status_code, first.status_code, replayed.status_code) == (403, 403, 204, 403)
        await until(lambda: "call.failed" in events_of(dial_id))
    assert events_of(dial_id) == ["call.dialing", "call.ringing", "call.failed"]  # the signed one, once


async def test_a_dial_the_carrier_refuses_fails_the_call_with_its_reason() -> None:
    """Twilio refuses the create-call request (here: the account's credentials are wrong, 401 20003): the application
    hears ``call.failed`` ``failed`` with Twilio's code, and the pacing slot is free again."""
    async with running_bridge(outbound_settings(outbound={"max_concurrent": 1, "calls_per_second": 100.0}), engine()) as bridge:
        assert isinstance(bridge.carrier, SimulatedTwilio)
        bridge.carrier.auth_token = "not-what-the-bridge-has"  # the bridge's requests no longer authenticate
        dial_id = (await post_call(bridge, {"carrier": "twilio", "to": CALLEE, "from": OURS})).json()["dial_id"]
        await until(lambda: "call.failed" in events_of(dial_id))
        failed = next(event for call, event in agent_app.CallsOut.events if event.type == "call.failed")
        again = await post_call(bridge, {"carrier": "twilio", "to": CALLEE, "from": OURS})
    assert failed.data["reason"] == "failed" and "401" in failed.data["detail"] and "20003" in failed.data["detail"], failed.data
    assert failed.call_id == dial_id  # Twilio never named the call
    assert again.json()["status"] == "dialing"  # the one slot is free


async def delete_call(bridge: RunningBridge, dial_id: str, *, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with http_client(timeout=5.0) as http:
        return await http.delete(f"{bridge.base_url}/calls/{dial_id}", headers=headers)


async def test_the_application_gives_up_on_calls_it_placed() -> None:
    """``DELETE /calls/{dial_id}``: a call still waiting for the carrier's rate is never dialled (200 canceled,
    ``call.failed`` canceled at once); a ringing one is canceled at the carrier (202 canceling: Twilio stops its
    ringing and reports ``canceled``, then ``call.failed`` canceled) long before its ring timeout; an answered one is a
    call like any other (409); an unknown one 404; without the token 401."""
    async with running_bridge(outbound_settings(), engine()) as bridge:  # one dial a second
        carrier = bridge.carrier
        assert isinstance(carrier, SimulatedTwilio)
        carrier.callees[CALLEE] = Callee(outcome="no_answer")
        carrier.callees["+15005550124"] = Callee(ring_ms=100, script=CallerScript(hangup_at_ms=3000))
        ringing = (await post_call(bridge, {"carrier": "twilio", "to": CALLEE, "from": OURS, "ring_timeout_s": 60})).json()["dial_id"]
        waiting = (await post_call(bridge, {"carrier": "twilio", "to": CALLEE, "from": OURS})).json()["dial_id"]
        assert (await delete_call(bridge, waiting, token=None)).status_code == 401
        gone = await delete_call(bridge, waiting)
        assert (gone.status_code, gone.json()["status"]) == (200, "canceled")
        await until(lambda: "call.ringing" in events_of(ringing))
        asked_at = time.monotonic()
        canceling = await delete_call(bridge, ringing)
        assert (canceling.status_code, canceling.json()["status"]) == (202, "canceling")
        await until(lambda: "call.failed" in events_of(ringing), timeout_s=5)
        assert time.monotonic() - asked_at < 2.0  # not its 60 s ring timeout
        answered = (await post_call(bridge, {"carrier": "twilio", "to": "+15005550124", "from": OURS})).json()["dial_id"]
        await until(lambda: "call.answered" in events_of(answered), timeout_s=5)
        assert (await delete_call(bridge, answered)).status_code == 409
        assert (await delete_call(bridge, "dl_nothing")).status_code == 404
        await until(lambda: "call.ended" in events_of(answered), timeout_s=8)
    assert events_of(waiting) == ["call.failed"]
    assert len(carrier.dialled) == 2  # the one waiting was never dialled
    assert [status for sid, status in carrier.status_reports if sid == next(iter(carrier.dialled))][-1] == "canceled"
    failures = {call.dial_id: event.data for call, event in agent_app.CallsOut.events if event.type == "call.failed"}
    assert failures[waiting]["reason"] == failures[ringing]["reason"] == "canceled", failures


async def test_the_campaign_example_places_a_csv_through_the_bridge() -> None:
    """``examples/campaign.py``: each row of the CSV a ``POST /calls``, its other columns the call's metadata; a bad
    number is refused with its reason and the rest go on."""
    from examples.campaign import place_all

    rows = [{"to": "+15005550201", "name": "Ada"}, {"to": "not-a-number", "name": "Bob"}, {"to": "+15005550202", "name": "Cy"}]
    async with running_bridge(outbound_settings(outbound={"calls_per_second": 10.0}), engine()) as bridge:
        assert isinstance(bridge.carrier, SimulatedTwilio)
        for row in rows:
            bridge.carrier.callees[row["to"]] = Callee(outcome="busy", ring_ms=50)
        placed = await place_all(rows, bridge=bridge.base_url, token=TOKEN, carrier="twilio", from_=OURS, per_second=20.0)
        dial_ids = [outcome for _, outcome in placed if outcome.startswith("dl_")]
        await until(lambda: all("call.failed" in events_of(dial_id) for dial_id in dial_ids), timeout_s=5)
    assert [outcome.split(":")[0] for _, outcome in placed] == [dial_ids[0], "refused", dial_ids[1]]
    assert "invalid_request" in placed[1][1]
    names = {call.dial_id: call.metadata.get("name") for call, _ in agent_app.CallsOut.events}
    assert [names[dial_id] for dial_id in dial_ids] == ["Ada", "Cy"]
