"""Exotel's HTTP side on a real bridge (uvicorn, loopback websockets): who may open the media socket, what goes
out on it, hang-up by closing, resume on a new stream of the same call, and bad input."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import time
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from callbridge.carriers.exotel.http import ExotelAdmission
from callbridge.carriers.exotel.settings import ExotelSettings
from callbridge.engine.commands import AppendAudio, CloseSession, CreateTextItem
from callbridge.sim.runner import RunningBridge, running_bridge
from tests.bridge.twilio_e2e import RecordingEngine, engine, known, settings, until

KEY = "exo-api-key"
TOKEN = "exo-api-token-" + "x" * 8


def exotel_settings(**exotel: Any) -> Any:
    sections: dict[str, Any] = {"exotel": {"api_key": KEY, "api_token": TOKEN, **exotel}}
    return settings(**sections)


class ExotelStream:
    """One Voicebot stream driven by hand, with Exotel's playback: chunks play at real time, marks are echoed
    when playback reaches them (at once if nothing is queued), ``clear`` drops the queue and echoes its marks."""

    def __init__(self, ws: ClientConnection, call_sid: str, rate: int) -> None:
        self.ws = ws
        self.call_sid = call_sid
        self.sid = "MZ" + secrets.token_hex(16)
        self.rate = rate
        self.sequence = 0
        self.chunks: list[int] = []
        """Sizes of the media chunks the bridge sent."""
        self.marks: list[str] = []
        self.clears = 0
        self.warnings: list[str] = []
        self._queue: list[tuple[str, Any]] = []
        self._reader: asyncio.Task[None] | None = None
        self._player: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, bridge: RunningBridge, *, key: str | None = KEY, token: str = TOKEN, call_sid: str | None = None,
                   rate: int = 8000, headers: dict[str, str] | None = None) -> ExotelStream:
        """Connect as Exotel does: the credentials in the URL become ``Authorization: Basic``."""
        host = bridge.base_url.removeprefix("http://")
        userinfo = f"{key}:{token}@" if key is not None else ""
        ws = await connect(f"ws://{userinfo}{host}/exotel/media?sample-rate={rate}", additional_headers=headers)
        return cls(ws, call_sid or secrets.token_hex(16), rate)

    def message(self, event: str, **body: Any) -> str:
        self.sequence += 1
        return orjson.dumps({"event": event, "sequence_number": str(self.sequence), "stream_sid": self.sid, **body}).decode()

    def start_message(self) -> str:
        start = {
            "stream_sid": self.sid, "call_sid": self.call_sid, "account_sid": "exotel1", "from": "+919800000001",
            "to": "+918000000002", "custom_parameters": {"lang": "en"},
            "media_format": {"encoding": "audio/x-raw", "sample_rate": str(self.rate), "bit_rate": "16"},
        }
        return self.message("start", start=start)

    async def start(self) -> None:
        await self.ws.send('{"event":"connected"}')
        await self.ws.send(self.start_message())
        self._reader = asyncio.create_task(self._read())
        self._player = asyncio.create_task(self._play())

    def media(self, pcm: bytes, timestamp_ms: int) -> str:
        body = {"chunk": str(self.sequence), "timestamp": str(timestamp_ms), "payload": base64.b64encode(pcm).decode()}
        return self.message("media", media=body)

    async def speak(self, ms: int, pcm: bytes | None = None) -> None:
        """``ms`` of caller audio (silence by default) in 100 ms chunks, at real time."""
        chunk = self.rate * 2 // 10
        audio = pcm if pcm is not None else bytes(self.rate * 2 * ms // 1000)
        began = time.monotonic()
        for i in range(0, len(audio), chunk):
            await self.ws.send(self.media(audio[i : i + chunk], 100 * (i // chunk)))
            await asyncio.sleep(max(0.0, began + 0.1 * (i // chunk + 1) - time.monotonic()))

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for raw in self.ws:
                message = orjson.loads(raw)
                if message.get("stream_sid") != self.sid:
                    self.warnings.append(f"stream_sid {message.get('stream_sid')!r}")
                event = message.get("event")
                if event == "media":
                    size = len(base64.b64decode(message["media"]["payload"]))
                    self.chunks.append(size)
                    if size % 320 or size < 3200 or size * 1000 // (self.rate * 2) < 100:
                        self.warnings.append(f"media chunk of {size} bytes")
                    self._queue.append(("media", size * 1000 // (self.rate * 2)))
                elif event == "mark":
                    self._queue.append(("mark", message["mark"]["name"]))
                elif event == "clear":
                    self.clears += 1
                    pending = [value for kind, value in self._queue if kind == "mark"]
                    self._queue.clear()
                    for name in pending:
                        await self._echo(name)
                else:
                    self.warnings.append(f"event {event!r}")

    async def _play(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                while self._queue and self._queue[0][0] == "mark":
                    await self._echo(self._queue.pop(0)[1])
                if self._queue:
                    _, ms = self._queue.pop(0)
                    await asyncio.sleep(ms / 1000)
                else:
                    await asyncio.sleep(0.005)

    async def _echo(self, name: str) -> None:
        self.marks.append(name)
        await self.ws.send(self.message("mark", mark={"name": name}))

    async def closed(self, timeout_s: float = 5.0) -> int | None:
        """Wait for the bridge to close the socket; its close code."""
        if self._reader is None:
            with contextlib.suppress(ConnectionClosed):
                await asyncio.wait_for(self._drain(), timeout_s)
        else:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout_s)
        await self.stop_playing()
        return self.ws.close_code

    async def _drain(self) -> None:
        async for _ in self.ws:
            pass

    async def stop_playing(self) -> None:
        if self._player is not None:
            self._player.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._player

    async def drop(self) -> None:
        """The connection goes away without a ``stop`` (a network drop)."""
        await self.stop_playing()
        await self.ws.close()
        if self._reader is not None:
            await self._reader


async def bridged(bridge: RunningBridge, recorder: RecordingEngine, **open_args: Any) -> ExotelStream:
    stream = await ExotelStream.open(bridge, **open_args)
    await stream.start()
    await until(lambda: recorder.session_count >= 1)
    return stream


def refused(bridge: RunningBridge, reason: str) -> float | None:
    return bridge.app.state.bridge.registry.get_sample_value("callbridge_streams_refused_total", {"provider": "exotel", "reason": reason})


class TestConversation:
    @pytest.mark.parametrize(("rate", "chunk"), [(8000, 3200), (16000, 3200), (24000, 4800)])
    async def test_greeting_goes_out_in_chunks_exotel_accepts(self, rate: int, chunk: int) -> None:
        recorder = engine(agent="tone")
        async with running_bridge(exotel_settings(), recorder) as bridge:
            stream = await bridged(bridge, recorder, rate=rate)
            await stream.speak(1500)
            await stream.ws.send(stream.message("stop", stop={"call_sid": stream.call_sid, "reason": "callended"}))
            assert await stream.closed() == 1000
        assert stream.warnings == []
        assert stream.chunks and set(stream.chunks) == {chunk}
        assert 600 <= len(stream.chunks) * chunk * 1000 // (rate * 2) <= 900  # the chime, once, padded to a frame
        assert len(stream.marks) >= len(stream.chunks)  # a mark after every frame, each echoed
        (session_id,) = recorder.opened
        heard = sum(len(c.pcm) for c in recorder.commands[session_id] if isinstance(c, AppendAudio)) * 1000 // (2 * 16000)
        assert 1200 <= heard <= 1500  # the caller's audio reached the engine (less what the resampler held)
        assert recorder.commands[session_id][-1] == CloseSession("call_ended")

    async def test_dtmf_reaches_the_engine(self) -> None:
        recorder = engine()
        async with running_bridge(exotel_settings(), recorder) as bridge:
            stream = await bridged(bridge, recorder)
            await stream.ws.send(stream.message("dtmf", dtmf={"digit": "5", "duration": "100"}))
            await stream.ws.send(stream.message("dtmf", dtmf={"digit": "#", "duration": "100"}))
            await until(lambda: len(recorder.of(CreateTextItem)) == 2)
            await stream.ws.send(stream.message("stop", stop={"reason": "callended"}))
            assert await stream.closed() == 1000
        assert recorder.of(CreateTextItem) == [CreateTextItem("DTMF 5"), CreateTextItem("DTMF #")]

    async def test_bridge_hangs_up_by_closing_and_the_call_stays_ended(self) -> None:
        recorder = engine()
        async with running_bridge(exotel_settings(), recorder) as bridge:
            stream = await bridged(bridge, recorder)
            await recorder.sessions[recorder.opened[0]].close("agent_ended_the_call")
            assert await stream.closed() == 1000  # the flow moves on to its next applet
            again = await ExotelStream.open(bridge, call_sid=stream.call_sid)  # the flow routes back here
            await again.start()
            assert await again.closed() == 1000  # refused: the call is over
            assert refused(bridge, "call_already_ended") == 1
            metrics = bridge.app.state.bridge.registry
            hangups = metrics.get_sample_value("callbridge_hangups_total", {"provider": "exotel", "result": "failed"})
        assert len(recorder.opened) == 1 and hangups is None  # no REST hang-up attempted

    async def test_a_new_stream_of_the_call_resumes_the_session(self) -> None:
        recorder = engine(agent="tone")
        async with running_bridge(exotel_settings(), recorder) as bridge:
            first = await bridged(bridge, recorder)
            await first.speak(400)
            await first.drop()
            await until(lambda: recorder.session_count == 0 or known(bridge.app.state.bridge.services.registry, first.call_sid))
            second = await ExotelStream.open(bridge, call_sid=first.call_sid)
            await second.start()
            await until(lambda: len(recorder.resumed) == 1)
            await second.speak(300)
            await second.ws.send(second.message("stop", stop={"reason": "callended"}))
            assert await second.closed() == 1000
        assert recorder.opened == recorder.resumed  # one engine session across both streams
        assert second.sid != first.sid and first.warnings == second.warnings == []


class TestAdmission:
    async def test_right_credentials_in_the_url_are_admitted(self) -> None:
        recorder = engine()
        async with running_bridge(exotel_settings(), recorder) as bridge:
            stream = await bridged(bridge, recorder)
            await stream.ws.send(stream.message("stop", stop={"reason": "callended"}))
            assert await stream.closed() == 1000
        assert len(recorder.opened) == 1

    @pytest.mark.parametrize(
        ("open_args", "label"),
        [
            ({"key": None}, "no credentials"),
            ({"token": "wrong"}, "wrong token"),
            ({"key": "other-key"}, "wrong key"),
            ({"key": None, "headers": {"Authorization": "Bearer " + TOKEN}}, "another scheme"),
            ({"key": None, "headers": {"Authorization": "Basic !!!"}}, "bad base64"),
        ],
    )
    async def test_anything_else_is_403(self, open_args: dict[str, Any], label: str) -> None:
        recorder = engine()
        async with running_bridge(exotel_settings(), recorder) as bridge:
            with pytest.raises(InvalidStatus) as exc:
                await ExotelStream.open(bridge, **open_args)
            assert refused(bridge, "bad_credentials") == 1, label
        assert exc.value.response.status_code == 403 and recorder.opened == []

    async def test_no_configured_credentials_refuses_everyone(self) -> None:
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            with pytest.raises(InvalidStatus) as exc:
                await ExotelStream.open(bridge)
        assert exc.value.response.status_code == 403

    async def test_source_outside_allowed_sources_is_403(self) -> None:
        recorder = engine()
        async with running_bridge(exotel_settings(allowed_sources=["203.0.113.0/24"]), recorder) as bridge:
            with pytest.raises(InvalidStatus) as exc:
                await ExotelStream.open(bridge)
            assert refused(bridge, "source_not_allowed") == 1
        assert exc.value.response.status_code == 403

    async def test_allowed_source_without_credentials_when_validation_is_off(self) -> None:
        recorder = engine()
        config = exotel_settings(allowed_sources=["127.0.0.0/8"], validate_credentials=False)
        async with running_bridge(config, recorder) as bridge:
            stream = await bridged(bridge, recorder, key=None)
            await stream.ws.send(stream.message("stop", stop={"reason": "callended"}))
            assert await stream.closed() == 1000
        assert len(recorder.opened) == 1

    async def test_a_full_bridge_refuses_the_upgrade(self) -> None:
        recorder = engine()
        config = exotel_settings()
        async with running_bridge(config.model_copy(update={"server": config.server.model_copy(update={"max_calls": 1})}), recorder) as bridge:
            first = await bridged(bridge, recorder)
            await until(lambda: len(bridge.app.state.bridge.services.active_calls) == 1)
            with pytest.raises(InvalidStatus) as exc:
                await ExotelStream.open(bridge)
            assert refused(bridge, "capacity") == 1
            await first.ws.send(first.message("stop", stop={"reason": "callended"}))
            assert await first.closed() == 1000
        assert exc.value.response.status_code == 403 and len(recorder.opened) == 1


def oversized() -> str:
    return '{"event":"media","pad":"' + "x" * 300_000 + '"}'


BAD_INPUT = {
    "non_json_text": (lambda s: "{this is not json", "not_json"),
    "binary_frame": (lambda s: b"\x00\x01\x02", "binary_frame"),
    "wrong_stream_sid": (lambda s: s.media(bytes(1600), 0).replace(s.sid, "MZ" + "0" * 32), "wrong_stream"),
    "invalid_base64": (lambda s: s.media(bytes(1600), 0).replace('"payload":"', '"payload":"%%'), "bad_base64"),
    "oversized_message": (lambda s: oversized(), "oversized"),
    "event_not_a_name": (lambda s: s.message("teleport").replace('"teleport"', "7"), "bad_field"),
    "odd_pcm_length": (lambda s: s.media(bytes(1601), 0), "bad_field"),
    "second_start": (lambda s: s.start_message(), "out_of_order"),
}


class TestBadInput:
    @pytest.mark.parametrize("case", sorted(BAD_INPUT))
    async def test_ends_that_call_cleanly(self, case: str) -> None:
        recorder = engine()
        build, reason = BAD_INPUT[case]
        async with running_bridge(exotel_settings(), recorder) as bridge:
            stream = await bridged(bridge, recorder)
            await stream.ws.send(build(stream))
            # over the websocket's limit: refused unread, 1009 (message too big); else the codec's refusal, 1008
            assert await stream.closed() == (1009 if case == "oversized_message" else 1008)
            await until(lambda: recorder.session_count == 0)
            metrics = bridge.app.state.bridge.registry
            labels = {"provider": "exotel", "reason": reason}
            await until(lambda: metrics.get_sample_value("callbridge_carrier_protocol_errors_total", labels) == 1)

    async def test_media_before_start(self) -> None:
        recorder = engine()
        async with running_bridge(exotel_settings(), recorder) as bridge:
            stream = await ExotelStream.open(bridge)
            await stream.ws.send(stream.media(bytes(1600), 0))
            assert await stream.closed() == 1008
        assert recorder.opened == []


class TestAdmissionUnit:
    def admission(self, **config: Any) -> ExotelAdmission:
        return ExotelAdmission.from_settings(ExotelSettings.model_validate({"api_key": KEY, "api_token": TOKEN, **config}))

    def test_basic_header_forms(self) -> None:
        admission = self.admission()
        good = base64.b64encode(f"{KEY}:{TOKEN}".encode()).decode()
        assert admission.refusal(f"Basic {good}", "10.0.0.1") is None
        assert admission.refusal(f"basic  {good} ", "10.0.0.1") is None
        for header in (None, "", "Basic", f"Basic {good[:-2]}", "Basic " + base64.b64encode(KEY.encode()).decode(),
                       "Basic " + base64.b64encode(f"{KEY}:{TOKEN}x".encode()).decode()):
            assert admission.refusal(header, "10.0.0.1") == "bad_credentials", header

    def test_sources(self) -> None:
        admission = self.admission(allowed_sources=["10.1.0.0/16", "2001:db8::/32", "192.0.2.7"], validate_credentials=False)
        assert admission.refusal(None, "10.1.2.3") is None
        assert admission.refusal(None, "::ffff:10.1.2.3") is None
        assert admission.refusal(None, "2001:db8::1") is None
        assert admission.refusal(None, "192.0.2.7") is None
        for peer in ("10.2.0.1", "192.0.2.8", None, "testclient"):
            assert admission.refusal(None, peer) == "source_not_allowed", peer

    def test_a_bad_cidr_is_a_startup_error(self) -> None:
        with pytest.raises(ValueError, match="allowed_sources"):
            self.admission(allowed_sources=["10.0.0.300/8"])

    def test_unconfigured_credentials_admit_nobody(self) -> None:
        admission = ExotelAdmission.from_settings(ExotelSettings())
        assert admission.refusal("Basic " + base64.b64encode(b":").decode(), "10.0.0.1") == "bad_credentials"
