"""Silero is loaded at start, in a worker thread: before, the first session loaded it on the event loop, and
every call up at that moment had a gap in its audio (the first SIP call's RTP stalled ~180 ms)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from callbridge.bridge.app import create_app
from callbridge.config import Settings
from callbridge.engine.local.engine import LocalEngine
from callbridge.engine.local.vad import SileroModel, shared_silero_model
from callbridge.engine.server import create_engine_app

pytestmark = pytest.mark.core


@pytest.fixture
def loads() -> Iterator[list[bool]]:
    """Each Silero load from now on, as whether it ran on a thread with a running event loop."""
    seen: list[bool] = []
    original = SileroModel.__init__

    def recording(self: SileroModel, path: Path | None = None) -> None:
        try:
            asyncio.get_running_loop()
            seen.append(True)
        except RuntimeError:
            seen.append(False)
        original(self, path)

    shared_silero_model.cache_clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SileroModel, "__init__", recording)
        yield seen


async def test_the_embedded_engine_warms_silero_up_in_a_worker_thread(loads: list[bool]) -> None:
    engine = LocalEngine()
    await engine.warm_up()
    assert loads == [False]  # loaded once, not on the loop
    assert shared_silero_model.cache_info().currsize == 1  # the sessions' scorers take this one
    await engine.warm_up()
    assert loads == [False]
    await engine.aclose()


@pytest.mark.parametrize("build", [lambda: create_app(Settings()), lambda: create_engine_app(Settings())], ids=["bridge", "engine-server"])
def test_the_server_has_silero_loaded_before_it_serves(loads: list[bool], build: object) -> None:
    app = build()  # type: ignore[operator]
    assert isinstance(app, FastAPI)
    assert loads == []
    with TestClient(app):  # its lifespan has run: the server answers from here on
        assert loads == [False]
