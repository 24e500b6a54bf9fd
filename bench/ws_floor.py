"""The websocket server's floor: what uvicorn costs per message pair before the bridge does anything.

    python bench/ws_floor.py [--calls 100] [--seconds 12] [--pin]

A uvicorn server in its own process runs an app that only echoes each text message back; N clients each send a
Twilio-sized ``media`` message every 20 ms (as a call does) and read the echoes. The server's CPU per message pair
(one in, one out) is measured over the run, for three servers: uvicorn's own ``websockets-sansio`` protocol and a
raw ASGI app (``stock``); the protocol ``callbridge serve`` uses (``callbridge.bridge.ws_protocol``, ``fast``);
and that protocol under a Starlette ``WebSocket`` endpoint (``starlette``: its routing and per-message state
checks). A call moves about 1.2 messages each way per 20 ms, so ×1.2 per frame is the part of a loaded
``callbridge serve``'s CPU that is the websocket server's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from typing import Any

MODES = ("stock", "fast", "starlette")
MESSAGE = (
    '{"event":"media","sequenceNumber":"2","media":{"track":"inbound","chunk":"1","timestamp":"0","payload":"'
    + "/" * 212
    + 'w=="},"streamSid":"MZ0123456789abcdef0123456789abcdef"}'
)


def serve(port: int, mode: str) -> None:
    import uvicorn

    from callbridge.bridge.ws_protocol import protocol_class

    async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await receive()
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] != "websocket.disconnect":
            await send({"type": "websocket.send", "text": message["text"]})

    app: Any = echo
    if mode == "starlette":
        from starlette.applications import Starlette
        from starlette.routing import WebSocketRoute
        from starlette.websockets import WebSocket, WebSocketDisconnect

        async def endpoint(websocket: WebSocket) -> None:
            await websocket.accept()
            try:
                while True:
                    await websocket.send_text(await websocket.receive_text())
            except WebSocketDisconnect:
                pass

        app = Starlette(routes=[WebSocketRoute("/", endpoint)])
    ws = "websockets-sansio" if mode == "stock" else protocol_class()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", ws=ws, ws_per_message_deflate=False)


def _cpu_ms(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def drive(port: int, pid: int, calls: int, seconds: float) -> float:
    """N clients at 50 messages a second each; the server's CPU µs per message pair over the middle of the run."""
    from websockets.asyncio.client import connect

    start = time.monotonic() + 1.0

    async def client(index: int) -> None:
        async with connect(f"ws://127.0.0.1:{port}/", compression=None) as ws:
            reader = asyncio.create_task(_drain(ws))
            sent = 0
            while (due := start + sent * 0.02 + index * 0.0002) < start + seconds:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await ws.send(MESSAGE)
                sent += 1
            reader.cancel()

    async def measure() -> float:
        await asyncio.sleep(start + 1.0 - time.monotonic())
        before = _cpu_ms(pid)
        await asyncio.sleep(seconds - 2.0)
        return (_cpu_ms(pid) - before) * 1000 / ((seconds - 2.0) * 50 * calls)

    per_pair, *_ = await asyncio.gather(measure(), *(client(i) for i in range(calls)))
    assert isinstance(per_pair, float)
    return per_pair


async def _drain(ws: Any) -> None:
    async for _ in ws:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--pin", action="store_true", help="server on the first CPU, clients on the others (Linux)")
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return
    from callbridge.sim.ports import free_port

    cpus = sorted(os.sched_getaffinity(0)) if args.pin else []
    print(f"{args.calls} clients, a message every 20 ms each, {args.seconds:g} s; server CPU per message pair (µs):")
    for mode in MODES:
        port = free_port()
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), mode])
        try:
            if cpus:
                os.sched_setaffinity(server.pid, {cpus[0]})
                os.sched_setaffinity(0, set(cpus[1:]) or {cpus[0]})
            time.sleep(2.0)
            per_pair = asyncio.run(drive(port, server.pid, args.calls, args.seconds))
        finally:
            server.terminate()
            server.wait(timeout=10)
        print(f"  {mode:9s} {per_pair:6.1f}   ({per_pair * 50 / 1000:.2f} ms per call-second at one pair per 20 ms)")


if __name__ == "__main__":
    main()
