"""A draining bridge answers the webhook of a call that is only moving (its stream's reconnect after the drain
moved it) with a short wait and a redirect back through the load balancer instead of a refusal, where another
process can resume it (the shared Redis registry); a new call too, a bounded number of times, then busy. Plivo
here, on a real uvicorn bridge and a real ``redis-server``, Telnyx's stream restart and Vonage's new socket;
Twilio across two real processes in ``test_fleet.py``. A lone process (the memory registry) moves nothing:
``test_drain_in_place.py``."""

from __future__ import annotations

import asyncio
import uuid
import xml.etree.ElementTree as ET

import pytest

from callbridge.bridge.fleet import DRAIN_NEW_CALL_BOUNCES
from callbridge.bridge.registry import LiveCall
from callbridge.carriers.telnyx.http import TelnyxCalls
from callbridge.engine.port import ResumeTicket
from callbridge.outbound_http import http_client
from callbridge.sim.runner import running_bridge
from tests.bridge.test_plivo_http import (
    PlivoStream,
    bridge_with,
    call_params,
    post_signed,
)
from tests.bridge.test_telnyx_http import BASE, RecordingRest, services
from tests.bridge.test_vonage_e2e import drain as vonage_drain
from tests.bridge.test_vonage_e2e import raw
from tests.bridge.twilio_e2e import engine, settings, until
from tests.redis_server import redis_url

__all__ = ["redis_url"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(60)


async def test_a_draining_bridge_sends_a_moving_call_back_to_the_load_balancer(redis_url: str) -> None:
    registry = {"backend": "redis", "redis_url": redis_url}
    recorder = engine()
    async with bridge_with(recorder, registry=registry) as bridge:
        services = bridge.app.state.bridge.services
        stream = await PlivoStream.open(bridge)
        await stream.ws.send(stream.start_message())
        await until(lambda: stream.call_uuid in services.live_streams)
        await stream.ws.send(stream.media())

        drain = asyncio.create_task(services.drain(5.0))
        await until(lambda: services.draining)
        async with http_client(timeout=5) as http:  # the load balancer's check: moving begins
            assert (await http.get(bridge.base_url + "/readyz")).status_code == 503
        assert await stream.closed() == 1001  # moved: the engine session is parked for the next stream
        await drain
        record = await services.registry.get(stream.call_uuid)
        assert record is not None and record.ticket is not None

        again = await post_signed(bridge, "/plivo/answer", call_params(stream.call_uuid))  # Plivo's <Redirect>
        new_call = [await post_signed(bridge, "/plivo/answer", call_params("c-new-during-drain")) for _ in range(DRAIN_NEW_CALL_BOUNCES + 1)]
        after = await services.registry.get(stream.call_uuid)
    assert again.status_code == 200 and all(answer.status_code == 200 for answer in new_call)
    # a new call: back through the load balancer (which has not taken this process out yet), a bounded number of
    # times across the fleet, then busy
    assert all(answer.text == again.text for answer in new_call[:-1])
    assert ET.fromstring(new_call[-1].text)[0].attrib == {"reason": "busy"}
    wait, redirect = ET.fromstring(again.text)
    assert wait.tag == "Wait" and wait.attrib == {"length": "1"}
    assert redirect.tag == "Redirect" and redirect.attrib == {"method": "POST"}
    assert redirect.text == bridge.base_url + "/plivo/answer"  # the public URL: the load balancer picks again
    assert after is not None and after.ticket == record.ticket and after.ended_reason is None  # nothing claimed here


@pytest.mark.parametrize("backend", ["redis", "memory"])
async def test_a_draining_bridge_restarts_the_telnyx_stream_of_a_call_another_process_can_resume(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """Telnyx has no redirect: its ``streaming.stopped`` webhook is the reconnect, and the process it reaches
    restarts the stream (to the public URL) or hangs the call up. Draining, a known call is restarted: where
    another process can resume it (Redis), or here, where the lone process serves its calls to their end
    (memory); a call the registry does not know is hung up either way."""
    registry = {"backend": "redis", "redis_url": request.getfixturevalue("redis_url")} if backend == "redis" else {}
    svc = services(registry=registry, engine={"open_at_answer": "off"})  # answered, never streamed: not in the registry
    calls = TelnyxCalls(svc, RecordingRest())
    try:
        for call_id in ("v3:moving", "v3:unknown"):
            await calls.on_event("call.initiated", {"call_control_id": call_id}, BASE)
        live = LiveCall("proc:MZ1", ResumeTicket("duplex-moving"))
        await svc.registry.mark_bound("v3:moving", 60_000, live)  # its stream is (was) bound: the registry knows the call
        svc.draining = True
        for call_id in ("v3:moving", "v3:unknown"):
            await calls.on_event("streaming.stopped", {"call_control_id": call_id}, BASE)
        sent = [(c, a) for c, a, _ in calls.rest.sent[2:]]  # type: ignore[attr-defined]
        assert sent == [("v3:moving", "streaming_start"), ("v3:unknown", "hangup")]
        assert await svc.registry.ended_reason("v3:moving") is None
    finally:
        await svc.registry.aclose()


async def test_a_draining_bridge_gives_a_vonage_call_it_moved_a_new_socket(redis_url: str) -> None:
    """Vonage's ``disconnected`` event is the reconnect: the process it reaches answers the new socket's NCCO (to
    the public URL). Draining, the call the drain just moved gets it, where before it got nothing and lost its
    audio; its session stays parked for whichever process the new socket reaches."""
    recorder = engine()
    registry = {"backend": "redis", "redis_url": redis_url}
    async with running_bridge(settings(registry=registry), recorder, provider="vonage") as bridge, raw(bridge) as client:
        services = bridge.app.state.bridge.services
        call_id = str(uuid.uuid4())
        ncco = (await client.answer(call_id)).json()
        ws, headers = await client.connect(ncco)
        await until(lambda: call_id in services.live_streams)
        await services.drain(5.0)  # moves the call: its session parked, its socket closed (1001)
        await vonage_drain(ws)
        assert ws.close_code == 1001
        event = {"uuid": "leg-1", "conversation_uuid": f"CON-{call_id}", "status": "disconnected", "headers": headers}
        again = (await client.event(event)).json()
        assert again[0]["endpoint"][0]["headers"]["call_uuid"] == call_id
        assert again[0]["endpoint"][0]["uri"] == bridge.base_url.replace("http", "ws", 1) + "/vonage/media"
        record = await services.registry.get(call_id)
        assert record is not None and record.ticket is not None and record.ended_reason is None
        assert (await client.answer(str(uuid.uuid4()))).json() == []  # a new call is still refused
