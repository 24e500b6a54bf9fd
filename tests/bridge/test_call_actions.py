"""The agent's call actions in the call core (sans-I/O, fake clock) and the policy in ``bridge/actions.py``."""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import orjson
import pytest
from pydantic import SecretStr

from callbridge.bridge.actions import (
    ActionResult,
    EndCall,
    SendDtmf,
    TransferCall,
    parse_call,
    telephony_tools,
)
from callbridge.bridge.call import CallState
from callbridge.bridge.call_outputs import PendingAction
from callbridge.bridge.end_reason import EndCause
from callbridge.carriers.base import HangUp
from callbridge.carriers.plivo.http import PlivoRest
from callbridge.carriers.telnyx.http import TelnyxCalls
from callbridge.carriers.vonage.http import VonageRest
from callbridge.engine.commands import CloseSession, FunctionCallOutput
from callbridge.engine.events import AudioDelta, FunctionCall, ResponseDone
from callbridge.outbound_http import http_client
from tests.bridge.test_call import Harness, agent_audio
from tests.bridge.twilio_e2e import engine
from tests.carriers.test_twilio import SID

TARGETS = ("+15550100", "sip:desk@pbx.example.com")


def actions_harness() -> Harness:
    return Harness(call_actions=True, transfer_targets=TARGETS).live()


def outputs(h: Harness) -> dict[str, dict[str, object]]:
    return {c.call_id: json.loads(c.output) for c in h.of(FunctionCallOutput)}


class TestPolicy:
    def test_the_tools_declared(self) -> None:
        tools = {t["name"]: t for t in telephony_tools(TARGETS)}
        assert set(tools) == {"end_call", "send_dtmf", "transfer_call"}
        assert tools["transfer_call"]["parameters"]["properties"]["target"]["enum"] == list(TARGETS)
        assert "transfer_call" not in {t["name"] for t in telephony_tools(())}

    @pytest.mark.parametrize(
        ("call", "expected"),
        [
            (FunctionCall("end_call", "c1"), EndCall()),
            (FunctionCall("send_dtmf", "c1", {"digits": "12#a"}), SendDtmf("12#A")),
            (FunctionCall("send_dtmf", "c1", {"digits": 42}), SendDtmf("42")),
            (FunctionCall("transfer_call", "c1", {"target": "+15550100"}), TransferCall("+15550100")),
        ],
    )
    def test_calls_within_the_policy(self, call: FunctionCall, expected: object) -> None:
        assert parse_call(call, TARGETS) == expected

    @pytest.mark.parametrize(
        ("call", "error"),
        [
            (FunctionCall("transfer_call", "c1", {"target": "+19005550199"}), "target_not_allowed"),  # never an arbitrary number
            (FunctionCall("transfer_call", "c1", {}), "target_not_allowed"),
            (FunctionCall("send_dtmf", "c1", {"digits": "12x"}), "bad_arguments"),
            (FunctionCall("send_dtmf", "c1", {"digits": "1" * 33}), "bad_arguments"),
            (FunctionCall("send_dtmf", "c1", {}), "bad_arguments"),
            (FunctionCall("launch_rockets", "c1"), "unknown_tool"),
        ],
    )
    def test_calls_outside_the_policy_are_refused(self, call: FunctionCall, error: str) -> None:
        result = parse_call(call, TARGETS)
        assert isinstance(result, ActionResult) and not result.ok and result.error == error

    def test_no_targets_no_transfer(self) -> None:
        result = parse_call(FunctionCall("transfer_call", "c1", {"target": "+15550100"}), ())
        assert isinstance(result, ActionResult) and result.error == "unknown_tool"

    def test_outputs_are_json_text(self) -> None:
        assert ActionResult.done().output() == '{"ok":true}'
        assert json.loads(ActionResult.unsupported("exotel", "transfer").output())["error"] == "unsupported"


class TestEndCall:
    def test_hangs_up_after_the_agents_audio_has_played(self) -> None:
        h = actions_harness()
        h.engine(AudioDelta(agent_audio(1000), 24000, "r1", "item_r1"))
        h.engine(ResponseDone("r1", "completed"))
        h.engine(FunctionCall("end_call", "call_1", response_id="r2"))
        assert outputs(h) == {"call_1": {"ok": True}}
        assert h.call.state is CallState.LIVE and h.call.link.hangup is None  # the goodbye is still playing
        h.advance(500)
        assert h.call.state is CallState.LIVE
        h.advance(1000)
        assert h.call.state is CallState.ENDED and h.call.phase.reason == "agent_hung_up"
        assert h.call.link.hangup == HangUp("agent_hung_up") and h.call.link.closed
        assert h.of(CloseSession) == [CloseSession("agent_hung_up")]
        played = sum(len(base64.b64decode(str(m["media"]["payload"]))) for m in h.events("media")) // 8  # type: ignore[index]
        assert 1000 <= played <= 1040  # all of it (the padded tail frame included) reached the carrier first

    def test_with_nothing_playing_hangs_up_at_once(self) -> None:
        h = actions_harness()
        h.engine(FunctionCall("end_call", "call_1"))
        assert h.call.state is CallState.ENDED and h.call.link.hangup == HangUp("agent_hung_up")

    def test_waits_for_a_response_still_streaming(self) -> None:
        h = actions_harness()
        h.engine(AudioDelta(agent_audio(200), 24000, "r1", "item_r1"))
        h.engine(FunctionCall("end_call", "call_1"))
        h.advance(2000)
        assert h.call.state is CallState.LIVE  # r1 has not ended: more audio may come
        h.engine(AudioDelta(agent_audio(200), 24000, "r1", "item_r1"))
        h.engine(ResponseDone("r1", "completed"))
        h.advance(1000)
        assert h.call.state is CallState.ENDED

    def test_disabled_actions_are_refused_and_the_call_goes_on(self) -> None:
        h = Harness().live()
        h.engine(FunctionCall("end_call", "call_1"))
        assert outputs(h)["call_1"]["error"] == "unknown_tool"
        assert h.call.state is CallState.LIVE and h.take_performed() == []


class TestCarrierActions:
    def test_transfer_goes_to_the_driver_and_success_ends_the_call(self) -> None:
        h = actions_harness()
        h.engine(FunctionCall("transfer_call", "call_t", {"target": "+15550100"}))
        assert h.take_performed() == [PendingAction("call_t", TransferCall("+15550100"))]
        assert h.of(FunctionCallOutput) == []  # answered when the carrier has done it
        h.call.action_finished("call_t", ActionResult.done(), h.now_ms)
        h.drain()
        assert outputs(h) == {"call_t": {"ok": True}}
        assert h.call.state is CallState.ENDED and h.call.phase.reason == "transferred"
        assert h.call.link.hangup == HangUp("transferred")  # a SIP transferor sends BYE once the REFER succeeded
        assert h.of(CloseSession) == [CloseSession("transferred")]

    def test_a_transfer_the_carrier_took_over_is_not_hung_up(self) -> None:
        h = actions_harness()
        h.engine(FunctionCall("transfer_call", "call_t", {"target": "+15550100"}))
        h.take_performed()
        h.call.action_finished("call_t", ActionResult.done(call_left=True), h.now_ms)
        h.drain()
        assert h.call.state is CallState.ENDED and h.call.link.hangup is None and h.call.link.closed

    def test_a_failed_transfer_is_reported_and_the_call_goes_on(self) -> None:
        h = actions_harness()
        h.engine(FunctionCall("transfer_call", "call_t", {"target": "+15550100"}))
        h.take_performed()
        h.engine(FunctionCall("transfer_call", "call_u", {"target": "+15550100"}))
        assert outputs(h)["call_u"]["error"] == "busy"  # one transfer at a time
        h.call.action_finished("call_t", ActionResult.failed("transfer_failed", "486 Busy Here"), h.now_ms)
        h.drain()
        assert outputs(h)["call_t"] == {"error": "transfer_failed", "detail": "486 Busy Here"}
        assert h.call.state is CallState.LIVE

    @pytest.mark.parametrize("succeeded", [True, False])
    def test_a_stop_while_the_transfer_is_under_way_waits_for_its_result(self, succeeded: bool) -> None:
        # Twilio stops the stream as the transfer's TwiML lands, before or after the REST update's answer: either
        # way the model hears the result before its session is closed, and the result says how the call ended.
        h = actions_harness()
        h.engine(FunctionCall("transfer_call", "call_t", {"target": "+15550100"}))
        h.take_performed()
        h.receive(f'{{"event":"stop","streamSid":"{SID}"}}')
        h.drain()
        assert h.call.state is CallState.ENDED and h.call.link.closed
        assert h.of(CloseSession) == [] and h.of(FunctionCallOutput) == []  # not yet: the result decides
        result = ActionResult.done() if succeeded else ActionResult.failed("transfer_failed", "busy")
        h.call.action_finished("call_t", result, h.now_ms)
        h.drain()
        assert outputs(h) == {"call_t": json.loads(result.output())}
        assert h.of(CloseSession) == [CloseSession("transferred" if succeeded else "call_ended")]
        assert h.call.phase.reason == ("transferred" if succeeded else "caller_hung_up")
        assert h.call.link.hangup is None  # the stream is over: nothing to hang up

    def test_dtmf_result_is_reported(self) -> None:
        h = actions_harness()
        h.engine(FunctionCall("send_dtmf", "call_d", {"digits": "123"}))
        assert h.take_performed() == [PendingAction("call_d", SendDtmf("123"))]
        h.call.action_finished("call_d", ActionResult.unsupported("twilio", "send DTMF"), h.now_ms)
        h.drain()
        assert outputs(h)["call_d"]["error"] == "unsupported"
        assert h.call.state is CallState.LIVE

    def test_a_result_after_the_call_ended_is_dropped(self) -> None:
        h = actions_harness()
        h.engine(FunctionCall("send_dtmf", "call_d", {"digits": "1"}))
        h.call.end_call(EndCause.of("max_call_duration"), h.now_ms)
        h.drain()
        h.call.action_finished("call_d", ActionResult.done(), h.now_ms)
        h.drain()
        assert h.of(FunctionCallOutput) == []


class TestTelnyx:
    """The agent's actions through Telnyx Call Control (the commands recorded, as ``test_telnyx_http`` does)."""

    async def test_send_dtmf_is_a_call_control_command(self) -> None:
        from tests.bridge.test_telnyx_http import RecordingRest, services

        svc = services()
        rest = RecordingRest()
        calls = TelnyxCalls(svc, rest)
        assert await calls.perform("v3:a", None, SendDtmf("12#")) == ActionResult.done()
        assert rest.sent == [("v3:a", "send_dtmf", {"digits": "12#", "duration_millis": 250})]
        rest.ended.add("v3:a")
        assert (await calls.perform("v3:a", None, SendDtmf("1"))).error == "call_ended"

    async def test_a_transfer_leaves_the_call_to_telnyx(self) -> None:
        from tests.bridge.test_telnyx_http import BASE, RecordingRest, services

        svc = services()
        rest = RecordingRest()
        calls = TelnyxCalls(svc, rest)
        await calls.on_event("call.initiated", {"call_control_id": "v3:a", "direction": "incoming"}, BASE)
        assert await calls.perform("v3:a", None, TransferCall("+15550100")) == ActionResult.done(call_left=True)
        assert rest.sent[-1] == ("v3:a", "transfer", {"to": "+15550100"})
        # the stream ends with the transfer: neither restarted nor hung up (that would cut the transferred call)
        await svc.registry.mark_ended("v3:a", "transferred")
        await calls.on_event("streaming.stopped", {"call_control_id": "v3:a"}, BASE)
        assert [a for _, a, _ in rest.sent] == ["answer", "transfer"]

    async def test_the_router_registers_telnyx_as_the_performer(self) -> None:
        from tests.bridge.test_telnyx_http import services

        svc = services()
        assert isinstance(svc.action_performers["telnyx"], TelnyxCalls)
        assert (await svc.perform_action("exotel", "c", None, TransferCall("+1"))).error == "unsupported"


class TestVonage:
    async def test_dtmf_and_transfer_on_the_voice_api(self, tmp_path: Path) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        path = tmp_path / "private.key"
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())
        path.write_bytes(pem)
        seen: list[httpx.Request] = []
        answers = iter([httpx.Response(200, json={"message": "DTMF sent", "uuid": "call-1"}), httpx.Response(204), httpx.Response(204), httpx.Response(404)])

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return next(answers)

        rest = VonageRest("https://api.example/", "app-1", path, client=http_client(transport=httpx.MockTransport(handler)))
        assert await rest.perform("call-1", None, SendDtmf("123")) == ActionResult.done()
        assert await rest.perform("call-1", None, TransferCall("+15550100")) == ActionResult.done(call_left=True)
        assert await rest.perform("call-1", None, TransferCall("sip:desk@pbx.example.com")) == ActionResult.done(call_left=True)
        assert (await rest.perform("call-1", None, SendDtmf("1"))).error == "call_ended"
        await rest.aclose()
        assert [(r.method, str(r.url)) for r in seen[:2]] == [
            ("PUT", "https://api.example/v1/calls/call-1/dtmf"),
            ("PUT", "https://api.example/v1/calls/call-1"),
        ]
        assert orjson.loads(seen[0].content) == {"digits": "123"}
        assert orjson.loads(seen[1].content) == {
            "action": "transfer",
            "destination": {"type": "ncco", "ncco": [{"action": "connect", "endpoint": [{"type": "phone", "number": "15550100"}]}]},
        }
        assert orjson.loads(seen[2].content)["destination"]["ncco"][0]["endpoint"] == [{"type": "sip", "uri": "sip:desk@pbx.example.com"}]
        assert all(r.headers["authorization"].startswith("Bearer ") for r in seen)


class TestPlivo:
    async def test_dtmf_and_transfer_requests(self) -> None:
        seen: list[httpx.Request] = []

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return httpx.Response(202, json={"message": "ok", "api_id": "x"})

        client = http_client(transport=httpx.MockTransport(handler))
        rest = PlivoRest("https://api.plivo.example", "MA123", SecretStr("tok"), client=client, public_url="https://bridge.example/")
        assert await rest.perform("uuid-1", None, SendDtmf("123")) == ActionResult.done()
        assert await rest.perform("uuid-1", None, TransferCall("+15550100")) == ActionResult.done(call_left=True)
        await rest.aclose()
        dtmf, transfer = seen
        assert (dtmf.method, str(dtmf.url)) == ("POST", "https://api.plivo.example/v1/Account/MA123/Call/uuid-1/DTMF/")
        assert orjson.loads(dtmf.content) == {"digits": "123", "legs": "aleg"}
        assert dtmf.headers["authorization"] == "Basic " + base64.b64encode(b"MA123:tok").decode()
        assert str(transfer.url) == "https://api.plivo.example/v1/Account/MA123/Call/uuid-1/"
        assert orjson.loads(transfer.content) == {
            "legs": "aleg",
            "aleg_url": "https://bridge.example/plivo/transfer?target=%2B15550100",
            "aleg_method": "POST",
        }

    async def test_the_transfer_xml_is_signed_and_only_for_allowed_targets(self) -> None:
        from tests.bridge.test_plivo_http import bridge_with, call_params, post_signed

        actions = {"enabled": True, "transfer_targets": ["+15550100", "sip:desk@pbx.example.com"]}
        async with bridge_with(engine(), call_actions=actions) as bridge:
            ok = await post_signed(bridge, "/plivo/transfer?target=%2B15550100", call_params("c-1"))
            sip = await post_signed(bridge, "/plivo/transfer?target=sip%3Adesk%40pbx.example.com", call_params("c-1"))
            forged = await post_signed(bridge, "/plivo/transfer?target=%2B15550100", call_params("c-1"), sign=False)
            elsewhere = await post_signed(bridge, "/plivo/transfer?target=%2B19005550199", call_params("c-1"))
        assert ET.fromstring(ok.text).find("Dial/Number").text == "15550100"  # type: ignore[union-attr]
        assert ET.fromstring(sip.text).find("Dial/User").text == "sip:desk@pbx.example.com"  # type: ignore[union-attr]
        assert forged.status_code == 403
        assert ET.fromstring(elsewhere.text).find("Hangup") is not None  # never a number outside the allow-list
