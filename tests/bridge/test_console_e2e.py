"""``/console`` through the real server: a simulated call listed live (server-sent events) while it is up, then among
the finished calls with its timeline and recording; every console and call-control route refusing a request without
its credentials; the console off where none is configured."""

from __future__ import annotations

import asyncio
import base64
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from callbridge.bridge.app import create_app
from callbridge.bridge.console_http import _LiveBoard
from callbridge.bridge.registry import MemoryCallRegistry, RegistryUnavailable
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from tests.bridge.test_cross_process import another_bridge
from tests.bridge.twilio_e2e import engine, settings, short_speech
from tests.redis_server import redis_url

__all__ = ["redis_url"]  # the fixture, imported for pytest

TOKEN = "console-token-0123456789"
_GUARDED = re.compile(r"^/(console|calls|talk|admin)(/|$)")


async def test_a_call_is_listed_live_within_a_second_then_found_with_its_timeline_and_recording(tmp_path: Path) -> None:
    config = settings(console={"token": TOKEN}, recording={"enabled": True, "directory": str(tmp_path)})
    async with running_bridge(config, engine()) as bridge:
        async with httpx.AsyncClient(base_url=bridge.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as http:
            seen: dict[str, tuple[float, dict[str, Any]]] = {}
            watching = asyncio.Event()

            async def watch() -> None:
                async with http.stream("GET", "/console/api/live") as response:
                    assert response.headers["content-type"].startswith("text/event-stream")
                    async for line in response.aiter_lines():
                        watching.set()
                        if line.startswith("data: "):
                            for card in orjson.loads(line[6:]):
                                seen.setdefault(card["call_id"], (time.time(), card))

            watcher = asyncio.create_task(watch())
            await asyncio.wait_for(watching.wait(), 5)
            result = await bridge.carrier.place_call(CallerScript(utterances=((600, short_speech(1000)),), hangup_at_ms=4000))
            watcher.cancel()
            call_id = result.call_sid
            assert call_id in seen, seen
            seen_at, card = seen[call_id]
            assert (card["carrier"], card["direction"], card["state"]) == ("twilio", "inbound", "up")
            assert seen_at - card["answered_at"] < 1.0, "the console lists a call within a second of its answer"

            async def finished() -> list[dict[str, Any]]:
                return (await http.get("/console/api/calls", params={"carrier": "twilio"})).json()["calls"]  # type: ignore[no-any-return]

            deadline = time.monotonic() + 5
            while not any(c["call_id"] == call_id for c in await finished()) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            listed = next(c for c in await finished() if c["call_id"] == call_id)
            assert (listed["state"], listed["end_reason"], listed["recording"]) == ("ended", "caller_hung_up", True), listed
            assert (await http.get("/console/api/calls", params={"live": 1})).json()["calls"] == []
            assert (await http.get("/console/api/calls", params={"reason": "engine"})).json()["calls"] == []

            detail = (await http.get(f"/console/api/calls/{call_id}")).json()
            kinds = [line["type"] for line in detail["timeline"]]
            assert kinds[0] == "call.answered" and "turn" in kinds and kinds[-1] == "call.ended", kinds
            assert detail["report"]["end_reason"] == "caller_hung_up" and detail["call"]["turns"] >= 1

            wav = await http.get(f"/console/api/calls/{call_id}/recording")
            assert wav.status_code == 200 and wav.headers["content-type"] == "audio/wav"
            assert wav.content[:4] == b"RIFF" and int.from_bytes(wav.content[22:24], "little") == 2  # stereo: caller, agent
            (bridge_status,) = (await http.get("/console/api/fleet")).json()["bridges"]  # this process, announced at its start
            assert (bridge_status["ready"], bridge_status["calls"], bridge_status["engine"]["kind"]) == (True, 0, "embedded"), bridge_status
            assert (await http.get("/console/api/calls/nobody")).status_code == 404
            assert (await http.get("/console/api/calls/nobody/recording")).status_code == 404


async def test_with_redis_each_bridge_s_console_shows_the_other_s_calls_and_the_whole_fleet(redis_url: str) -> None:
    """Two bridges share a real Redis: a call answered on A is listed live, then finished with its timeline, on B's
    console; both consoles list both bridges."""
    config = settings(console={"token": TOKEN}, registry={"backend": "redis", "redis_url": redis_url})
    shared = engine()
    async with running_bridge(config, shared) as a, another_bridge(a, shared) as b:
        async with httpx.AsyncClient(base_url=b.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as on_b:
            placed = asyncio.create_task(a.carrier.place_call(CallerScript(utterances=((300, short_speech(800)),), hangup_at_ms=3000)))

            async def live_on_b() -> list[dict[str, Any]]:
                return (await on_b.get("/console/api/calls", params={"live": 1})).json()["calls"]  # type: ignore[no-any-return]

            live: list[dict[str, Any]] = []
            while not live and not placed.done():
                live = await live_on_b()
                await asyncio.sleep(0.1)
            result = await placed
            assert [card["call_id"] for card in live] == [result.call_sid], live
            await until_async(lambda: _finished_on(on_b, result.call_sid), timeout_s=5)
            detail = (await on_b.get(f"/console/api/calls/{result.call_sid}")).json()
            assert detail["report"]["end_reason"] == "caller_hung_up"
            processes = {status["process_id"] for status in (await on_b.get("/console/api/fleet")).json()["bridges"]}
            services = (a.app.state.bridge.services, b.app.state.bridge.services)
            assert processes >= {s.process_id for s in services}


async def _finished_on(http: httpx.AsyncClient, call_id: str) -> bool:
    return any(card["call_id"] == call_id for card in (await http.get("/console/api/calls")).json()["calls"])


async def until_async(check: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.1)


def _api_routes(routes: Sequence[BaseRoute]) -> Iterator[APIRoute]:
    """Every HTTP route of the app, those of the routers it includes too (FastAPI keeps an included router whole)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):
            yield from _api_routes(route.original_router.routes)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def test_every_console_and_call_control_route_refuses_a_request_without_its_credentials() -> None:
    """The app's own route table walked: each route under /console, /calls, /talk and /admin, each of its methods,
    with no credentials, a wrong bearer token and wrong basic credentials: 401, and nothing of a call in the answer."""
    config = settings(
        console={"token": TOKEN, "password": "console-password"}, outbound={"api_token": "outbound-token-0123456789"},
        webrtc={"token": "webrtc-token-0123456789"}, server={"admin_token": "admin-token-0123456789"},
        engine={"kind": "realtime", "urls": ["ws://127.0.0.1:9/v1/realtime"]},  # a pool: /admin/engines is served
    )  # fmt: skip
    app = create_app(config)
    routes = [(route.path, method) for route in _api_routes(app.routes) if _GUARDED.match(route.path) for method in sorted(route.methods)]
    assert {path for path, _ in routes} >= {
        "/console", "/console/api/calls", "/console/api/live", "/console/api/calls/{call_id}", "/console/api/calls/{call_id}/recording",
        "/console/api/fleet", "/calls", "/calls/{dial_id}", "/talk", "/talk/offer", "/admin/engines", "/admin/engines/drain",
    }  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bridge.example") as http:
        for path, method in routes:
            url = re.sub(r"\{[^}]+\}", "CA0123", path)
            for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": _basic("operator", "wrong-password")}):
                response = await http.request(method, url, headers=headers, content=b'{"to": "+15551230000"}')
                assert response.status_code == 401, (method, path, headers, response.status_code, response.text)
                assert "CA0123" not in response.text and "+1555" not in response.text
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bridge.example") as http:
        response = await http.get("/console/api/calls", headers={"Authorization": _basic("operator", "console-password")})
        assert response.status_code == 200 and response.json() == {"calls": [], "page": 0, "older": False}
        challenge = await http.get("/console")
        assert challenge.headers["www-authenticate"].startswith('Basic realm="callbridge console"')


async def test_the_console_is_not_served_without_a_credential() -> None:
    app = create_app(settings(), engine())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bridge.example") as http:
        for path in ("/console", "/console/api/calls", "/console/api/live"):
            assert (await http.get(path)).status_code == 404


async def test_a_search_pages_through_every_finished_call_kept_a_page_at_a_time() -> None:
    """A search reads ``SEARCHED`` (500) finished calls a request: the oldest of 1,001 kept is not on page 0 or 1, it is
    on page 2, where ``older`` turns false."""
    from callbridge.application import CallContext
    from callbridge.application.events import CallEvent
    from callbridge.bridge.console_http import SEARCHED

    app = create_app(settings(console={"token": TOKEN}), engine())
    registry = app.state.bridge.services.registry
    for n in range(2 * SEARCHED + 1):  # the first is the oldest
        context = CallContext(call_id=f"CA{n}", carrier="twilio", caller_number=f"+1555{n:07d}", called_number="+15559870000")
        answered = CallEvent(type="call.answered", call_id=f"CA{n}", at=100.0 + n, data={}).model_dump_json()  # type: ignore[arg-type]
        await registry.journal(f"CA{n}", [answered], 3_600_000, header=context.model_dump_json(), opened_at=100.0 + n, ended_at=200.0 + n)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bridge.example", headers=headers) as http:
        pages = [(await http.get("/console/api/calls", params={"number": "+15550000000", "page": page})).json() for page in range(3)]
        newest = (await http.get("/console/api/calls", params={"limit": 1})).json()
    assert [(len(p["calls"]), p["older"]) for p in pages] == [(0, True), (0, True), (1, False)]
    assert pages[2]["calls"][0]["call_id"] == "CA0" and newest["calls"][0]["call_id"] == f"CA{2 * SEARCHED}"


async def test_a_registry_that_fails_gets_the_operator_a_503_and_the_live_list_keeps_what_it_showed() -> None:
    app = create_app(settings(console={"token": TOKEN}), engine())
    registry = app.state.bridge.services.registry

    async def down(*_: object, **__: object) -> Any:
        raise RegistryUnavailable("journaled", "down")

    registry.journaled = registry.journal_of = registry.announced = down
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bridge.example") as http:
        for path in ("/console/api/calls", "/console/api/calls?live=1", "/console/api/calls/CA1", "/console/api/fleet"):
            response = await http.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert response.status_code == 503 and "down" in response.json()["detail"], (path, response.text)
    board = _LiveBoard(registry, max_viewers=1)
    watching = board.watch()
    assert await anext(watching) == b"[]" and board.viewers == 1
    await watching.aclose()
    assert board.viewers == 0


async def test_a_live_view_ends_once_its_bridge_is_stopping_so_that_it_cannot_hold_the_shutdown() -> None:
    stopping = False
    board = _LiveBoard(MemoryCallRegistry(), max_viewers=1, stopping=lambda: stopping)
    watching = board.watch()
    assert await anext(watching) == b"[]"
    following = asyncio.ensure_future(anext(watching))
    await asyncio.sleep(0.1)
    stopping = True  # the drain began: the reader sees it within LIVE_EVERY_S and every watch ends
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(following, 5)
    assert board.viewers == 0
