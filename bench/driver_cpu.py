"""The bridge without its websocket server: CPU per call-second of N Twilio calls through ``MediaStreamDriver``.

    python bench/driver_cpu.py [--calls 100] [--seconds 10] [--app MODULE:ATTR] [--record DIR]

Each call is a real ``MediaStreamDriver`` (the call state machine, codecs, resamplers, playout ledger, pacing)
on the embedded loopback engine, fed one Twilio ``media`` message per 20 ms through an in-memory transport that
echoes the markers back at once, as Twilio does when the audio before them has played. What a loaded
``callbridge serve`` spends beyond this is its websocket server (``bench/ws_floor.py``) and the sockets. The
process's own CPU is measured, so run it pinned (``taskset -c 0``) on a quiet machine.

``--app``: each call is answered by that application first (``app.module``; its assistant chosen as at the
answer webhook), so its call events flow through the bridge's queue to the application's ``event`` hook.
``--record DIR``: every call is recorded there (``[recording]``).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from hot_path import CALLER_ULAW, CONNECTED, START, media  # noqa: E402

from callbridge.application import CallContext  # noqa: E402
from callbridge.bridge.app import create_app  # noqa: E402
from callbridge.bridge.media import MediaStreamDriver  # noqa: E402
from callbridge.carriers.twilio.wire import TwilioCodec  # noqa: E402
from callbridge.config import Settings  # noqa: E402
from callbridge.sim.loadtest import LOAD_TEST_BARGE_IN  # noqa: E402


class MemoryTransport:
    """A Twilio media connection in memory: the test feeds messages; markers sent come straight back."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[str | None] = asyncio.Queue()
        self.sent = 0

    async def receive(self) -> str | bytes | None:
        return await self.inbox.get()

    async def send(self, message: str | bytes) -> None:
        self.sent += 1
        if isinstance(message, str) and '"event":"mark"' in message:
            self.inbox.put_nowait(message)

    async def close(self, code: int) -> None:
        self.inbox.put_nowait(None)


async def run(calls: int, seconds: float, app: str | None = None, record: Path | None = None) -> tuple[float, float]:
    sections: dict[str, object] = {"local_engine": {"agent": "loopback"}, "server": {"max_calls": 10_000, "cpu_budget_percent": 0}, "barge_in": LOAD_TEST_BARGE_IN}
    if app is not None:
        sections["app"] = {"module": app}
    if record is not None:
        sections["recording"] = {"enabled": True, "directory": str(record)}
    services = create_app(Settings.model_validate(sections)).state.bridge.services
    transports = [MemoryTransport() for _ in range(calls)]
    for index, transport in enumerate(transports):
        call_id = f"CA{index:032x}"
        if services.assistants is not None:
            await services.desk.choose_assistant(CallContext(call_id=call_id, carrier="twilio", caller_number="+15005550006"))
        transport.inbox.put_nowait(CONNECTED)
        transport.inbox.put_nowait(START.replace("CA" + "2" * 32, call_id))
    drivers = [asyncio.create_task(MediaStreamDriver(t, TwilioCodec(), services, check_token=False).run()) for t in transports]
    await asyncio.sleep(0.5)
    started, frames = time.monotonic(), 0
    before = resource.getrusage(resource.RUSAGE_SELF)
    while time.monotonic() < started + seconds:
        message = media(CALLER_ULAW, frames)
        for transport in transports:
            transport.inbox.put_nowait(message)
        frames += 1
        await asyncio.sleep(max(0.0, started + frames * 0.02 - time.monotonic()))
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_ms = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000
    sent_per_frame = sum(t.sent for t in transports) / (calls * frames)
    for transport in transports:
        transport.inbox.put_nowait(None)
    await asyncio.gather(*drivers, return_exceptions=True)
    return cpu_ms / (calls * frames * 0.02), sent_per_frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--app", metavar="MODULE:ATTR", help="answer each call with this application (app.module)")
    parser.add_argument("--record", metavar="DIR", type=Path, help="record every call there")
    args = parser.parse_args()
    import uvloop

    from callbridge.config import LogSettings
    from callbridge.logging import configure_logging

    configure_logging(LogSettings(level="warning"))
    per_call_second, sent = uvloop.run(run(args.calls, args.seconds, args.app, args.record))
    print(f"{args.calls} calls, {args.seconds:g} s: {per_call_second:.2f} CPU-ms per call-second ({sent:.2f} messages out per frame)")


if __name__ == "__main__":
    main()
