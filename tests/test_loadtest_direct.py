"""``callbridge loadtest --ws-url``: simulated Twilio calls straight onto any server that speaks Twilio Media Streams
(a voice bot; pipecat's transport is the reference of issue #19), no webhook, no signatures — here a small bot on
real uvicorn that plays each caller frame back in 100 ms chunks and marks them, as a bot does."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from callbridge.cli import main
from callbridge.config import Settings
from callbridge.sim.loadtest import LoadTestOptions, load_test_samples
from callbridge.sim.ports import free_port
from callbridge.sim.runner import load_wav_8k, sample_caller_wav, serving

CHUNK_FRAMES = 5
"""The bot sends back 100 ms per ``media`` message."""


class LoopbackBot:
    """A Twilio Media Streams bot that says back what it hears, and what it saw of each call."""

    def __init__(self) -> None:
        self.app = FastAPI()
        self.calls: list[list[str]] = []
        """Per call, the events it received, in order (``media`` once)."""
        self.starts: list[dict[str, Any]] = []
        self.marks_echoed = 0
        self.app.add_api_websocket_route("/ws", self.serve)

    async def serve(self, websocket: WebSocket) -> None:
        await websocket.accept()
        events: list[str] = []
        self.calls.append(events)
        pending, stream_sid, sent = b"", "", 0
        try:
            while True:
                message = orjson.loads(await websocket.receive_text())
                event = message["event"]
                if event != "media" or "media" not in events:
                    events.append(event)
                if event == "start":
                    self.starts.append(message["start"])
                    stream_sid = message["streamSid"]
                elif event == "mark":
                    self.marks_echoed += 1
                elif event == "media":
                    pending += base64.b64decode(message["media"]["payload"])
                    if len(pending) >= 160 * CHUNK_FRAMES:
                        payload = base64.b64encode(pending).decode()
                        await websocket.send_text(orjson.dumps({"event": "media", "streamSid": stream_sid, "media": {"payload": payload}}).decode())
                        sent += 1
                        await websocket.send_text(orjson.dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": str(sent)}}).decode())
                        pending = b""
                elif event == "stop":
                    return
        except WebSocketDisconnect:
            return


@asynccontextmanager
async def bot() -> AsyncIterator[tuple[LoopbackBot, str]]:
    loopback, port = LoopbackBot(), free_port()
    async with serving(loopback.app, port):
        yield loopback, f"ws://127.0.0.1:{port}/ws"


async def test_calls_go_straight_onto_a_twilio_protocol_bot() -> None:
    async with bot() as (loopback, url):
        options = LoadTestOptions(calls=3, ramp_s=0.3, duration_s=3.0, click_every_ms=500, audio=load_wav_8k(sample_caller_wav()), progress=False)
        samples = await load_test_samples(Settings(), "twilio", options, url=None, secret="", rest_url="", ws_url=url)
    report = samples.report()
    assert report.failed_calls == 0 and report.protocol_warnings == 0, report.render()
    assert [events[:3] for events in loopback.calls] == [["connected", "start", "media"]] * 3
    assert all(events[-1] == "stop" for events in loopback.calls)  # each call hung up the Twilio way
    assert all(start["mediaFormat"] == {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1} for start in loopback.starts)
    assert report.frames_sent == 3 * 150 and report.frames_received >= report.frames_sent - 3 * 2 * CHUNK_FRAMES
    assert report.clicks_returned >= report.clicks_sent - 3, report.render()
    # a click waits for its 100 ms chunk to fill: 0–80 ms in the bot, plus the loopback sockets
    assert 0 <= report.round_trip_ms["p50"] <= 100 + report.generator_tick_lag_ms["max"], report.render()
    assert loopback.marks_echoed >= 3 * (150 // CHUNK_FRAMES) - 3 * 3  # the simulated Twilio echoed the bot's marks
    # what the server sent, counted: a media message and a mark every 100 ms (the last, short chunk never sent)
    assert 2 * (1000 // (20 * CHUNK_FRAMES)) - 3 <= report.bridge_messages_per_call_second <= 2 * (1000 // (20 * CHUNK_FRAMES))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--ws-url", "http://127.0.0.1:1/ws"], "expected a ws:// or wss:// URL"),
        (["--ws-url", "ws://127.0.0.1:1/ws", "--url", "http://127.0.0.1:1"], "not with --url"),
        (["--ws-url", "ws://127.0.0.1:1/ws", "--provider", "plivo"], "not with --provider"),
        (["--ws-url", "ws://127.0.0.1:1/ws", "--drop-every", "2"], "not with --drop-every"),
    ],
)
def test_the_direct_mode_says_what_it_cannot_do(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", *args]) == 2
    assert says in capsys.readouterr().err


def test_a_server_that_is_not_there_fails_the_calls(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    code = main(["loadtest", "--ws-url", f"ws://127.0.0.1:{port}/ws", "--calls", "2", "--ramp", "0", "--duration", "1"])
    out = capsys.readouterr().out
    assert code == 1 and "2 calls (2 failed)" in out, out
