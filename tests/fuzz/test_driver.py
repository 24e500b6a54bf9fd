"""The real path, fuzzed: a bridge on uvicorn with the embedded engine, and Twilio media streams over loopback
websockets that start properly and then send near-valid messages in any order before the caller's side
closes. Each stream's driver finishes (none is left waiting), nothing escapes it, and the bridge stays up."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from callbridge.bridge.media import MediaStreamDriver
from callbridge.engine.port import SessionConfig
from callbridge.outbound_http import http_client
from callbridge.sim.runner import RunningBridge, running_bridge
from tests.bridge.twilio_e2e import RawStream, engine, settings
from tests.fuzz.strategies import budget, mutated

pytestmark = pytest.mark.hot_path
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""


class DriverRuns:
    """Counts the drivers that start and finish, and keeps whatever escapes one."""

    def __init__(self) -> None:
        self.started = 0
        self.finished = 0
        self.escaped: list[BaseException] = []


@pytest.fixture
async def bridge(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[RunningBridge, DriverRuns]]:
    runs = DriverRuns()
    original = MediaStreamDriver.run

    async def run(self: MediaStreamDriver) -> None:
        runs.started += 1
        try:
            await original(self)
        except BaseException as exc:
            runs.escaped.append(exc)
            raise
        finally:
            runs.finished += 1

    monkeypatch.setattr(MediaStreamDriver, "run", run)
    recorder = engine()
    warm = await recorder.open(SessionConfig())  # the first session loads the VAD model: not in a stream's time
    await warm.close()
    async with running_bridge(settings(server={"idle_timeout_s": 30.0}), recorder) as running:
        yield running, runs


def _templates(stream: RawStream) -> list[dict[str, Any]]:
    sid = stream.sid
    return [
        orjson.loads(stream.media(timestamp=20)),
        orjson.loads(stream.media(timestamp=40)),
        orjson.loads(stream.start_message()),
        {"event": "dtmf", "streamSid": sid, "dtmf": {"track": "inbound_track", "digit": "1"}},
        {"event": "mark", "streamSid": sid, "mark": {"name": "resp-1@200"}},
        {"event": "stop", "streamSid": sid, "stop": {"callSid": stream.call_sid}},
        {"event": "connected", "protocol": "Call", "version": "1.0.0"},
    ]


@budget(0.1)
@given(data=st.data())
async def test_every_stream_driver_finishes(bridge: tuple[RunningBridge, DriverRuns], data: st.DataObject) -> None:
    running, runs = bridge
    stream = await RawStream.open(running)
    try:  # closed whatever happens: hypothesis may abandon an example while drawing it
        await stream.start()
        templates = _templates(stream)
        one = (
            st.sampled_from(templates)
            .flatmap(lambda m: mutated(m, 2))
            .map(lambda m: orjson.dumps(m).decode() if _dumpable(m) else "{}")
        )
        sent = data.draw(st.lists(one | st.binary(max_size=20), max_size=10), label="messages")
        with contextlib.suppress(ConnectionClosed):
            for message in sent:
                await stream.ws.send(message)
    finally:
        await stream.ws.close()
    async with asyncio.timeout(10):  # no driver is left waiting on a stream that is gone (a hang, not a timing)
        while runs.finished < runs.started:
            await asyncio.sleep(0.01)
    assert runs.escaped == []
    async with http_client() as http:
        assert (await http.get(running.base_url + "/healthz")).status_code == 200


def _dumpable(message: Any) -> bool:
    try:
        orjson.dumps(message)
    except TypeError:
        return False
    return True
