"""The floor under issue #19's CPU goal: the leanest Python Twilio loopback that does a call's per-frame work, side
by side with pipecat's loopback and ``callbridge serve``, in one run, by the same generator.

    python bench/floor_loopback.py --calls 30 [--duration 20] [--ramp 5] [--servers pipecat,raw,asgi,callbridge]
        [--compiled DIR]

``raw`` and ``asgi`` are not bridges. For each ``media`` message they do only what a loopback call's audio must
go through, with callbridge's own steps: base64 and μ-law decode, 8 → 16 kHz (``LowDelayResampler``, the
bridge's inbound step), 16 → 24 kHz (soxr QQ, the embedded loopback agent's step), 24 → 8 kHz (the bridge's
outbound step), μ-law encode, 20 ms framing, one ``media`` message back per frame. No markers, no playout
ledger, no barge-in, no call state, no tokens, no limits, no metrics, no logs, no engine session: everything the
product adds is missing, so what they cost is below anything that carries real calls in Python with 20 ms
messages each way.

- ``raw``: one ``asyncio.Protocol`` per socket on uvloop, websockets' sans-I/O protocol for the handshake and the
  inbound frames, each reply written to the transport directly (header + payload, one ``write``).
- ``asgi``: the same work as an ASGI app under uvicorn with the websocket protocol ``callbridge serve`` uses
  (``callbridge.bridge.ws_protocol``): the server stack of the bridge without the bridge.

Each level: a fresh server of each kind pinned to the first CPU, ``callbridge loadtest --ws-url`` (``--url`` for
callbridge: its answer webhook too) on the others; CPU is the server process's own per call-second. The last
column is each server's CPU over pipecat's in the same run: issue #19 asks callbridge for ≤ 0.3×.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import loadtest_carriers  # noqa: E402
import side_by_side  # noqa: E402

from callbridge.config import ServerSettings  # noqa: E402
from callbridge.sim.ports import free_port  # noqa: E402

SERVERS = ("pipecat", "raw", "asgi", "callbridge")
"""With ``--compiled DIR`` also ``compiled``: ``callbridge serve`` from that compiled tree (``bench/compiled_tree.py``)."""
_FRAME_BYTES = 160
"""20 ms of μ-law at 8 kHz."""


class LoopbackPipeline:
    """One call's audio path, caller → engine → caller: what each ``media`` message costs at the least."""

    def __init__(self) -> None:
        import audioop  # noqa: PLC0415 — audioop-lts on 3.13

        import numpy as np
        import orjson
        import soxr

        from callbridge.codecs.lowdelay import LowDelayResampler

        self._audioop, self._orjson, self._np = audioop, orjson, np
        self._in = LowDelayResampler(8000, 16000)
        self._agent = soxr.ResampleStream(16000, 24000, 1, dtype="int16", quality="QQ")
        self._out = LowDelayResampler(24000, 8000)
        self._pending = bytearray()
        self.stream_sid = ""

    def on_text(self, text: bytes | str) -> list[bytes]:
        """The replies (UTF-8 JSON) to one Twilio message."""
        audioop, orjson = self._audioop, self._orjson  # imported once per call, not per message
        message = orjson.loads(text)
        event = message.get("event")
        if event == "start":
            self.stream_sid = message["streamSid"]
            return []
        if event != "media":
            return []
        pcm_8k = audioop.ulaw2lin(base64.b64decode(message["media"]["payload"]), 2)
        pcm_16k = self._in.process(pcm_8k)
        pcm_24k = self._agent.resample_chunk(self._np.frombuffer(pcm_16k, dtype=self._np.int16)).tobytes()
        self._pending += audioop.lin2ulaw(self._out.process(pcm_24k), 2)
        replies = []
        while len(self._pending) >= _FRAME_BYTES:
            frame, self._pending = bytes(self._pending[:_FRAME_BYTES]), self._pending[_FRAME_BYTES:]
            body = {"event": "media", "streamSid": self.stream_sid, "media": {"payload": base64.b64encode(frame).decode()}}
            replies.append(orjson.dumps(body))
        return replies


def serve_raw(port: int) -> None:
    import uvloop
    from websockets.frames import Frame, Opcode
    from websockets.http11 import Request
    from websockets.server import ServerProtocol

    from callbridge.bridge.ws_protocol import frame_header

    class FloorProtocol(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.ws = ServerProtocol(max_size=1 << 20)
            self.call = LoopbackPipeline()

        def data_received(self, data: bytes) -> None:
            ws = self.ws
            ws.receive_data(data)
            for event in ws.events_received():
                if isinstance(event, Request):
                    ws.send_response(ws.accept(event))
                elif isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                    for reply in self.call.on_text(event.data):
                        self.transport.write(frame_header(0x81, len(reply)) + reply)
            for chunk in ws.data_to_send():
                if chunk:
                    self.transport.write(chunk)
                else:
                    self.transport.close()

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(FloorProtocol, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


def serve_asgi(port: int) -> None:
    import uvicorn

    from callbridge.bridge.ws_protocol import protocol_class

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] == "http":  # the load tester's readiness probe
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        await receive()
        await send({"type": "websocket.accept"})
        call = LoopbackPipeline()
        while (message := await receive())["type"] != "websocket.disconnect":
            for reply in call.on_text(message["text"]):
                await send({"type": "websocket.send", "text": reply.decode()})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", ws=protocol_class(count_unauthenticated=False),
                ws_per_message_deflate=False, lifespan="on")  # fmt: skip


def run_floor(kind: str, calls: int, args: argparse.Namespace) -> dict[str, object]:
    """One level against a fresh floor server of ``kind``; the load test's JSON report."""
    port = free_port()
    return loadtest_carriers.measure(
        [sys.executable, __file__, "--serve", kind, str(port)], f"http://127.0.0.1:{port}/", ["--ws-url", f"ws://127.0.0.1:{port}/ws"],
        loadtest_carriers._clean_env(), args.out / f"{kind}-{calls}.json", calls, args,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    if "--serve" in sys.argv:
        kind, port = parser.parse_known_args()[0].serve
        serve_raw(int(port)) if kind == "raw" else serve_asgi(int(port))
        return
    loadtest_carriers.add_run_arguments(parser, calls="30")
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--pipecat-python", default=str(side_by_side.ROOT.parent / "pipecat-venv" / "bin" / "python"))
    parser.add_argument("--peer", type=Path, default=side_by_side.ROOT.parent / "shared" / "peers" / "pipecat_loopback.py")
    args = loadtest_carriers.pinned_run(parser, "callbridge-floor-")
    args.cpu_budget = ServerSettings().cpu_budget_percent
    kinds = list(dict.fromkeys(args.servers.split(",") + (["compiled"] if args.compiled else [])))  # each once
    rows = []
    for calls in (int(level) for level in args.calls.split(",")):
        reports: dict[str, dict[str, object]] = {}
        for kind in kinds:
            if kind == "pipecat":
                reports[kind] = side_by_side.run_pipecat(calls, args)
            elif kind in ("callbridge", "compiled"):
                tree = args.compiled if kind == "compiled" else None
                reports[kind] = loadtest_carriers.run_one("twilio", calls, argparse.Namespace(**{**vars(args), "compiled": tree}))
            else:
                reports[kind] = run_floor(kind, calls, args)
        reference = reports.get("pipecat", {}).get("server_cpu_ms_per_call_second")
        for kind, report in reports.items():
            cpu = report["server_cpu_ms_per_call_second"]
            trip = side_by_side._stats(report, "round_trip_ms")
            assert isinstance(cpu, float)
            ratio = f"**{cpu / reference:.2f}×**" if isinstance(reference, float) else "n/a"
            rows.append(
                f"| {calls} | {kind} | {trip['p50']:.1f} / {trip['p99']:.1f} | {report['frames_received']} / {report['frames_sent']} "
                f"| {side_by_side._failed(report)} | {cpu:.2f} | {report['server_rss_mb']:.1f} | {ratio} |"
            )
    columns = ["calls", "server", "round trip p50 / p99 ms", "frames back", "failed", "CPU-ms per call-s", "RSS MB", "CPU ÷ pipecat's"]
    loadtest_carriers.print_table(args, columns, rows)


if __name__ == "__main__":
    main()
