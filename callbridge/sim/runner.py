"""Run a bridge in this process and place simulated calls on it: ``callbridge simulate``, the tests, the demo.

The bridge is the real thing — ``create_app`` on uvicorn, over loopback — with
signature validation on: the simulated carrier signs with the same secret,
and serves the REST hang-up the bridge is pointed at.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
import urllib.error
import urllib.request
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np
import soxr
import uvicorn
from fastapi import FastAPI

from callbridge.application.events import CallEvent
from callbridge.bridge.app import create_app
from callbridge.bridge.http_protocol import serving_options
from callbridge.carriers import DEFAULT_SIMULATED, carrier_spec
from callbridge.config import Settings
from callbridge.engine.port import DuplexEngine
from callbridge.sim.carrier import CallerScript, CallResult, SimulatedCarrier
from callbridge.sim.ports import bound_socket, free_port
from callbridge.sim.simulators import simulator_class

_REPORT_WAIT_S: Final = 5.0
"""How long ``simulate_call`` waits for the call's ``call.ended`` after the caller hung up."""

__all__ = [
    "RunningBridge",
    "free_port",
    "load_wav_8k",
    "running_bridge",
    "sample_caller_wav",
    "serving",
    "simulate_call",
    "wait_http_up",
    "write_wav_8k",
]


def wait_http_up(url: str, timeout_s: float = 60.0) -> None:
    """Wait until ``url`` answers below 500 (a server process starting); ``TimeoutError`` past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up within {timeout_s} s")


def sample_caller_wav() -> Path:
    """A bundled caller utterance (espeak-ng: "Hello, I would like to book a table for two tonight.")."""
    return Path(str(resources.files("callbridge.sim") / "data" / "caller_8k.wav"))


def load_wav_8k(path: Path) -> bytes:
    """A PCM16 WAV file, any rate and channel count, as PCM16 mono 8 kHz."""
    with wave.open(str(path)) as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV files are supported")
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").reshape(-1, wav.getnchannels())
        rate = wav.getframerate()
    mono = samples.mean(axis=1).astype(np.int16) if samples.shape[1] > 1 else samples[:, 0]
    if rate != 8000:
        mono = soxr.resample(mono, rate, 8000, quality="HQ")
    return np.asarray(mono, dtype="<i2").tobytes()


def write_wav_8k(path: Path, pcm: bytes) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(8000)
        wav.writeframes(pcm)


@dataclass
class RunningBridge:
    settings: Settings
    app: FastAPI
    base_url: str
    carrier: SimulatedCarrier


def with_overrides(settings: Settings, overrides: dict[str, dict[str, Any]]) -> Settings:
    data = settings.model_dump()
    for section, values in overrides.items():
        data[section] = {**data[section], **values}
    return Settings.model_validate(data)


@asynccontextmanager
async def running_bridge(
    settings: Settings, engine: DuplexEngine | None = None, *, provider: str = DEFAULT_SIMULATED
) -> AsyncIterator[RunningBridge]:
    """``callbridge serve`` on a free loopback port with a simulated ``provider`` wired to it."""
    listener = bound_socket()
    port = listener.getsockname()[1]
    secret = secrets.token_hex(16)
    base_url = f"http://127.0.0.1:{port}"
    carrier = simulator_class(carrier_spec(provider))(base_url, secret)
    rest_url = await carrier.start_rest(bound_socket())
    overrides = carrier.bridge_settings(secret, rest_url)
    overrides["server"] = {**overrides.get("server", {}), "host": "127.0.0.1", "port": port, "public_url": base_url}
    if "cpu_budget_percent" not in settings.server.model_fields_set:  # the simulator's CPU is in this process too
        overrides["server"]["cpu_budget_percent"] = 0
    settings = with_overrides(settings, overrides)
    carrier.configure(settings)
    app = create_app(settings, engine)
    try:
        async with serving(app, listener):
            yield RunningBridge(settings, app, base_url, carrier)
    finally:
        await carrier.aclose()


@asynccontextmanager
async def serving(app: FastAPI, port: int | socket.socket) -> AsyncIterator[None]:
    """``app`` on uvicorn at ``127.0.0.1:port`` (or on a socket already bound there: ``bound_socket``), as
    ``callbridge serve`` runs it, in this event loop."""
    sock = port if isinstance(port, socket.socket) else None
    number: int = port.getsockname()[1] if isinstance(port, socket.socket) else port
    config = uvicorn.Config(
        app, host="127.0.0.1", port=number, log_config=None, access_log=False, lifespan="on", **serving_options()
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock] if sock is not None else None))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)


async def simulate_call(
    settings: Settings, script: CallerScript, provider: str = DEFAULT_SIMULATED, *, events: list[CallEvent] | None = None
) -> CallResult:
    """One simulated call through an in-process bridge. ``events``: the call events the application is sent are
    added to it (with an application that takes them), up to its ``call.ended`` (waited for a while)."""
    async with running_bridge(settings, provider=provider) as bridge:
        delivery = bridge.app.state.bridge.services.events
        if events is not None and delivery is not None:
            delivery.observers.append(lambda _call, event: events.append(event))
        result = await bridge.carrier.place_call(script)
        if events is not None and delivery is not None:
            deadline = time.monotonic() + _REPORT_WAIT_S
            while not any(event.type == "call.ended" for event in events) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        return result
