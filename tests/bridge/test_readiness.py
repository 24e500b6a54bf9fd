"""``/readyz`` says 503, and why, whenever the process could take no new call — not only while draining — so a
load balancer that follows it sends calls elsewhere: every engine endpoint ejected (dead servers, found by the
probes) or drained by the operator; the registry (Redis) unreachable. It comes back to 200 once they do, with
nothing restarted. Real uvicorn, real ``redis-server``, shipped settings but for the parts named."""

from __future__ import annotations

import time

import httpx
import pytest

from callbridge.config import Settings
from callbridge.outbound_http import http_client
from callbridge.sim.runner import RunningBridge, free_port, running_bridge
from tests.bridge.test_engine_pool_e2e import TOKEN, admin
from tests.bridge.twilio_e2e import RawStream, bound, engine, post_answer, settings, until
from tests.redis_server import redis_server, start_redis

pytestmark = pytest.mark.timeout(60)


def one_engine(url: str) -> Settings:
    """The shipped settings, with one engine server at ``url`` (probed every 5 s, ejected after 3 failures)."""
    return Settings.model_validate({"engine": {"kind": "realtime", "urls": [url]}, "server": {"admin_token": TOKEN}})


async def readiness(base_url: str) -> tuple[int, str]:
    async with http_client(timeout=5) as http:
        response = await http.get(base_url + "/readyz")
    return response.status_code, str(response.json()["status"])


@pytest.mark.long
async def test_every_engine_endpoint_ejected_is_not_ready() -> None:
    """The shipped probes (every 5 s, the first as the process starts, ejected after 3 failures): a server nobody
    listens for is found dead within 15 s of the start (#40: it was 16.4 s after it listened)."""
    dead = f"ws://127.0.0.1:{free_port()}"
    began = time.monotonic()
    async with running_bridge(one_engine(dead)) as bridge:
        assert await readiness(bridge.base_url) == (200, "ready")  # nothing known against it yet
        await until(lambda: _is(bridge.base_url, (503, "no_engine")), timeout_s=30)
        found_s = time.monotonic() - began
        assert (await admin(bridge, "GET", "/admin/engines")).json()["endpoints"][0]["state"] == "ejected"
    print(f"dead endpoint found, /readyz 503, {found_s:.1f} s after the bridge began to start")
    assert found_s < 15  # the probes begin at the start (at 0, 5 and 10 s): before, the first waited 5 s (16.4 s)


async def test_every_engine_endpoint_drained_by_the_operator_is_not_ready_until_one_is_back() -> None:
    """The endpoint need not be up for this: draining is the operator's word, ejection the probes'."""
    dead = f"ws://127.0.0.1:{free_port()}"
    async with running_bridge(one_engine(dead)) as bridge:  # its first probe fails at once; ejection needs 3, 5 s apart
        assert await readiness(bridge.base_url) == (200, "ready")
        assert (await admin(bridge, "POST", "/admin/engines/drain", url=dead)).status_code == 200
        assert await readiness(bridge.base_url) == (503, "no_engine")
        assert (await admin(bridge, "POST", "/admin/engines/undrain", url=dead)).status_code == 200
        assert await readiness(bridge.base_url) == (200, "ready")


async def test_a_registry_that_does_not_answer_is_not_ready_then_ready_again_when_it_is_back() -> None:
    with redis_server() as (url, process):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        async with running_bridge(Settings.model_validate({"registry": {"backend": "redis", "redis_url": url}})) as bridge:
            assert await readiness(bridge.base_url) == (200, "ready")
            process.kill()
            process.wait()
            await until(lambda: _is(bridge.base_url, (503, "registry_unavailable")), timeout_s=10)
            again = start_redis(port)
            try:
                await until(lambda: _is(bridge.base_url, (200, "ready")), timeout_s=10)
            finally:
                again.terminate()
                again.wait(timeout=10)


async def _is(base_url: str, expected: tuple[int, str]) -> bool:
    return await readiness(base_url) == expected



async def test_a_new_call_while_the_registry_is_down_gets_busy_not_an_application_error(caplog: pytest.LogCaptureFixture) -> None:
    """Redis killed with a call up: a new Twilio call is refused busy (``<Reject reason="busy"/>``, HTTP 200),
    logged as a warning with no traceback; the call already up carries on; once Redis is back the next call is
    answered. Before: HTTP 500 with an error-level traceback, which Twilio plays as an application error."""
    recorder = engine()
    with redis_server() as (url, process):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        async with running_bridge(settings(registry={"backend": "redis", "redis_url": url}), recorder) as bridge:
            live = await RawStream.open(bridge)
            await live.start()
            await until(lambda: bound(bridge.app.state.bridge.services.registry, live.call_sid))  # bridged
            process.kill()
            process.wait()
            caplog.clear()
            refused = await answer(bridge, "CA" + "e" * 32)
            assert refused.status_code == 200 and 'reason="busy"' in refused.text, refused.text
            assert not [r for r in caplog.records if r.exc_info or r.levelname in ("ERROR", "CRITICAL")]
            await live.ws.send(live.media())  # the call already up is not touched
            assert live.ws.close_code is None and recorder.session_count == 1
            again = start_redis(port)
            try:
                await until(lambda: _is(bridge.base_url, (200, "ready")), timeout_s=10)
                answered = await answer(bridge, "CA" + "d" * 32)
                assert "<Connect>" in answered.text, answered.text  # the first write after the outage succeeds
            finally:
                again.terminate()
                again.wait(timeout=10)
            await live.ws.close()


async def answer(bridge: RunningBridge, call_sid: str) -> httpx.Response:
    """Twilio's signed answer webhook for a new call."""
    return await post_answer(bridge, call_sid, timeout_s=10)
