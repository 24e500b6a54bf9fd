"""The HTTP surface: a real uvicorn process over loopback, and the app in memory for draining."""

from __future__ import annotations

import json
import signal

import httpx
from fastapi.testclient import TestClient

from callbridge import __version__
from callbridge.bridge.app import create_app
from callbridge.compiled import compiled_modules
from callbridge.config import Settings
from tests.conftest import ServedBridge


def test_served_health_ready_metrics_and_clean_sigterm(served_bridge: ServedBridge) -> None:
    health = httpx.get(served_bridge.base_url + "/healthz")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "version": __version__}
    ready = httpx.get(served_bridge.base_url + "/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "active_calls": 0}
    metrics = httpx.get(served_bridge.base_url + "/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    compiled = "true" if compiled_modules() else "false"  # a pure-Python install here; the compiled build in CI's second pass
    assert f'callbridge_build_info{{compiled="{compiled}",version="{__version__}"}} 1.0' in metrics.text
    assert "process_cpu_seconds_total" in metrics.text
    assert httpx.get(served_bridge.base_url + "/nope").status_code == 404

    served_bridge.process.send_signal(signal.SIGTERM)
    assert served_bridge.process.wait(timeout=15) == 0
    assert served_bridge.process.stderr is not None
    events = [json.loads(line) for line in served_bridge.process.stderr.read().splitlines()]
    names = [event["event"] for event in events]
    assert "bridge_started" in names and "bridge_stopping" in names
    assert all("timestamp" in event and "level" in event for event in events)


def test_readyz_turns_503_when_draining() -> None:
    app = create_app(Settings())
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        app.state.bridge.draining = True
        response = client.get("/readyz")
        assert response.status_code == 503 and response.json() == {"status": "draining"}
        assert client.get("/healthz").status_code == 200


def test_shutdown_marks_draining() -> None:
    app = create_app(Settings())
    with TestClient(app):
        assert app.state.bridge.draining is False
    assert app.state.bridge.draining is True


def test_apps_do_not_share_metrics() -> None:
    first, second = create_app(Settings()), create_app(Settings())
    assert first.state.bridge.registry is not second.state.bridge.registry
