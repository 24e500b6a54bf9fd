"""One ``callbridge serve`` process on its shipped defaults (the embedded engine), Twilio configured with the
simulated account's credentials, for the tests that need the real process: its signals, its memory, its sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from callbridge.carriers.twilio.sim import SimulatedTwilio
from callbridge.sim.runner import free_port
from tests.bridge.test_fleet import SECRET, Process, _start
from tests.conftest import wait_http_ok

__all__ = ["Served", "served"]


@dataclass
class Served:
    bridge: Process
    twilio: SimulatedTwilio
    port: int


@asynccontextmanager
async def served(tmp_path: Path, *, nofile: int | None = None) -> AsyncIterator[Served]:
    """``callbridge serve``, ready, with the simulated Twilio pointed at it; stopped (killed if still up) after.
    ``nofile``: its file descriptor limit."""
    twilio = SimulatedTwilio("http://unused", SECRET)
    rest_url = await twilio.start_rest(free_port())
    lines = [f"[{section}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in values.items())
             for section, values in SimulatedTwilio.bridge_settings(SECRET, rest_url).items()]  # fmt: skip
    config = tmp_path / "callbridge.toml"
    config.write_text("\n".join(lines) + "\n")
    port = free_port()
    bridge = _start("bridge", ["serve"], config, port, tmp_path, nofile=nofile)
    try:
        await asyncio.to_thread(wait_http_ok, bridge.url + "/readyz", bridge.process, 60)  # type: ignore[arg-type]
        twilio.bridge_url = bridge.url
        yield Served(bridge, twilio, port)
    finally:
        bridge.stop()
        await twilio.aclose()
