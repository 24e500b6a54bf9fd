"""A signed webhook is taken once (issue #15 item 3): the same signed request again is refused 403, on every carrier
that signs, by every process sharing the registry; a request the bridge failed to answer may come again.

Each carrier's request is signed as its simulator signs it (``callbridge.sim``), sent to ``callbridge serve`` on
its shipped defaults over loopback, then sent again byte for byte."""

from __future__ import annotations

import asyncio
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest
from twilio.request_validator import RequestValidator

from callbridge.bridge.registry import MemoryCallRegistry
from callbridge.bridge.registry_redis import redis_registry
from callbridge.carriers.plivo.sim import SimulatedPlivo
from callbridge.carriers.telnyx.sim import SimulatedTelnyx
from callbridge.carriers.vonage.sim import application_id_for, sign_webhook
from callbridge.config import load_settings
from callbridge.outbound_http import http_client
from callbridge.sim.runner import RunningBridge, running_bridge
from tests.bridge.twilio_e2e import engine, settings
from tests.redis_server import redis_url

__all__ = ["redis_url"]  # the fixture, imported for pytest

Request = tuple[str, str, dict[str, str], bytes]
"""method, URL, headers, body: one signed request, to send as often as a test likes."""


def _twilio_form(bridge: RunningBridge, path: str, header: str, params: dict[str, str]) -> Request:
    url = bridge.base_url + path
    secret = bridge.carrier.secret
    body = urllib.parse.urlencode(params).encode()
    headers = {header: RequestValidator(secret).compute_signature(url, params), "content-type": "application/x-www-form-urlencoded"}
    return "POST", url, headers, body


def twilio_answer(bridge: RunningBridge) -> Request:
    return _twilio_form(bridge, "/twilio/voice", "X-Twilio-Signature", bridge.carrier.answer_params("CA" + secrets.token_hex(16), first=True))


def twilio_status(bridge: RunningBridge) -> Request:
    params = {"AccountSid": bridge.carrier.account_sid, "CallSid": "CA" + secrets.token_hex(16), "StreamSid": "MZ" + secrets.token_hex(16),
              "StreamEvent": "stream-started", "Timestamp": "2026-12-02T06:00:00.000Z"}  # fmt: skip
    return _twilio_form(bridge, "/twilio/stream-status", "X-Twilio-Signature", params)


def signalwire_answer(bridge: RunningBridge) -> Request:
    params = bridge.carrier.answer_params("CA" + secrets.token_hex(16), first=True)  # type: ignore[attr-defined]
    return _twilio_form(bridge, "/signalwire/voice", "X-SignalWire-Signature", params)


def telnyx_event(bridge: RunningBridge) -> Request:
    carrier = bridge.carrier
    assert isinstance(carrier, SimulatedTelnyx)
    body = carrier.webhook_body("call.hangup", carrier.new_call_id(), hangup_cause="normal_clearing")
    return "POST", bridge.base_url + "/telnyx/events", carrier.signed(body), body


def plivo_hangup(bridge: RunningBridge) -> Request:
    carrier = bridge.carrier
    assert isinstance(carrier, SimulatedPlivo)
    url = bridge.base_url + "/plivo/hangup"
    params = carrier.call_params(carrier.new_call_id(), "completed")
    headers = {**carrier._signed("POST", url, params), "content-type": "application/x-www-form-urlencoded"}
    return "POST", url, headers, urllib.parse.urlencode(params).encode()


def vonage_event(bridge: RunningBridge) -> Request:
    secret = bridge.carrier.secret
    body = orjson.dumps({"status": "started", "uuid": secrets.token_hex(16), "conversation_uuid": "CON-" + secrets.token_hex(8)})
    headers = {"authorization": sign_webhook(secret, application_id_for(secret), body), "content-type": "application/json"}
    return "POST", bridge.base_url + "/vonage/events", headers, body


SIGNED: dict[str, tuple[str, Callable[[RunningBridge], Request]]] = {
    "twilio answer": ("twilio", twilio_answer),
    "twilio stream status": ("twilio", twilio_status),
    "signalwire answer": ("signalwire", signalwire_answer),
    "telnyx event": ("telnyx", telnyx_event),
    "plivo hangup": ("plivo", plivo_hangup),
    "vonage event": ("vonage", vonage_event),
}


async def _send(http: httpx.AsyncClient, request: Request) -> int:
    method, url, headers, body = request
    return (await http.request(method, url, headers=headers, content=body)).status_code


def _checks(bridge: RunningBridge, provider: str, result: str) -> float:
    value = bridge.app.state.bridge.registry.get_sample_value(
        "callbridge_webhook_replay_checks_total", {"provider": provider, "result": result}
    )
    return value or 0.0


@pytest.mark.parametrize("name", list(SIGNED))
async def test_a_signed_webhook_sent_again_is_refused(name: str) -> None:
    provider, build = SIGNED[name]
    async with running_bridge(settings(), engine(), provider=provider) as bridge:
        request = build(bridge)
        async with http_client(timeout=5) as http:
            first = await _send(http, request)
            replayed = [await _send(http, request) for _ in range(3)]
            fresh = await _send(http, build(bridge))  # the carrier's next request, signed anew: taken
        assert first in (200, 204) and fresh in (200, 204), (first, fresh)
        assert replayed == [403, 403, 403]
        assert _checks(bridge, provider, "replayed") == 3 and _checks(bridge, provider, "first") == 2


async def test_a_replayed_answer_mints_no_token_for_the_call() -> None:
    """The harm a replay would do: the answer webhook mints a stream token for a live call, and a stream with it
    takes the call's engine session over. The replay gets a 403 and no TwiML."""
    async with running_bridge(settings(), engine()) as bridge:
        request = twilio_answer(bridge)
        async with http_client(timeout=5) as http:
            method, url, headers, body = request
            answered = await http.request(method, url, headers=headers, content=body)
            replayed = await http.request(method, url, headers=headers, content=body)
    assert answered.status_code == 200 and 'name="token"' in answered.text
    assert replayed.status_code == 403 and "token" not in replayed.text


async def test_a_request_answered_with_an_error_may_come_again() -> None:
    """The carrier retries a webhook it got no answer to: one the bridge failed (5xx) is forgotten, so the retry,
    the very same signed request, is taken."""
    async with running_bridge(settings(), engine()) as bridge:
        services = bridge.app.state.bridge.services.desk
        original: Callable[..., Awaitable[Any]] = services.decide_answer
        failures = [RuntimeError("the registry fell over")]

        async def failing_once(*args: Any, **kwargs: Any) -> Any:
            if failures:
                raise failures.pop()
            return await original(*args, **kwargs)

        services.decide_answer = failing_once
        request = twilio_answer(bridge)
        async with http_client(timeout=5) as http:
            statuses = [await _send(http, request) for _ in range(3)]
    assert statuses == [500, 200, 403]  # failed; the retry taken; then a replay


async def test_a_replay_is_refused_by_every_process_on_the_shared_registry(redis_url: str) -> None:
    """Two processes (two clients of one Redis): what one took, the other refuses; of many asking at once, one."""
    shared = load_settings(None, {"registry": {"backend": "redis", "redis_url": redis_url}})
    (a, _), (b, _) = redis_registry(shared), redis_registry(shared)
    try:
        key = "twilio:" + secrets.token_hex(20)
        assert await a.remember_once(key, 60_000) and not await b.remember_once(key, 60_000)
        await a.forget(key)
        assert await b.remember_once(key, 60_000)
        racing = "telnyx:" + secrets.token_hex(20)
        clients = [redis_registry(shared)[0] for _ in range(8)]
        taken = await asyncio.gather(*(client.remember_once(racing, 60_000) for client in clients))
        assert sorted(taken) == [False] * 7 + [True]
        for client in clients:
            await client.aclose()
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_bridge_on_redis_refuses_a_replay(redis_url: str) -> None:
    async with running_bridge(settings(registry={"backend": "redis", "redis_url": redis_url}), engine()) as bridge:
        request = twilio_answer(bridge)
        async with http_client(timeout=5) as http:
            assert [await _send(http, request) for _ in range(2)] == [200, 403]


async def test_the_memory_registry_forgets_a_proof_when_its_window_ends() -> None:
    now = [0]
    registry = MemoryCallRegistry(clock=lambda: now[0])
    assert await registry.remember_once("k", 1000)
    now[0] = 999
    assert not await registry.remember_once("k", 1000)
    now[0] = 1000
    assert await registry.remember_once("k", 1000)  # its window is over: a signature this old is refused anyway


async def test_the_memory_registry_holds_a_bounded_number_of_proofs() -> None:
    registry = MemoryCallRegistry(clock=lambda: 0)
    registry.MAX_REMEMBERED = 3  # type: ignore[misc]
    for key in "abcd":
        assert await registry.remember_once(key, 60_000)
    assert await registry.remember_once("a", 60_000)  # the oldest went first
    assert not await registry.remember_once("d", 60_000)
