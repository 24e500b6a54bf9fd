"""The AudioSocket listener end to end: a real TCP server on loopback, the shared driver and the embedded
engine, with a hand-driven Asterisk client that speaks the wire protocol of ``res_audiosocket``."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from callbridge.bridge.app import BridgeState
from callbridge.bridge.carrier_plugin import load_carrier
from callbridge.bridge.services import BridgeServices
from callbridge.carriers import carrier_spec
from callbridge.carriers.audiosocket.listener import AudioSocketListener, source_allowed
from callbridge.carriers.audiosocket.wire import AUDIO_KINDS, PROFILE, frame
from callbridge.engine.commands import AckPlayback, CloseSession, CreateTextItem
from callbridge.sim.runner import free_port
from tests.bridge.twilio_e2e import (
    RecordingEngine,
    engine,
    known,
    settings,
    short_speech,
    until,
)

FRAME_MS = 20


@dataclass
class Asterisk:
    """One ``AudioSocket(<uuid>,host:port)`` connection as Asterisk makes it: the uuid frame first, then 20 ms
    slin frames at real time; what comes back is played at once (no buffer), so the client records how far
    ahead of real time the bridge ever got."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    call_id: uuid.UUID
    kind: int = 0x10
    received: bytearray = field(default_factory=bytearray)
    kinds_received: set[int] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)
    hangup_received: bool = False
    closed_by_bridge: bool = False
    hung_up: bool = False
    max_ahead_ms: float = 0.0
    _play_end: float = 0.0
    _reader_task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, port: int, call_id: uuid.UUID | None = None, kind: int = 0x10, *, send_uuid: bool = True) -> Asterisk:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer, call_id or uuid.uuid4(), kind)
        if send_uuid:
            writer.write(frame(0x01, client.call_id.bytes))
        client._reader_task = asyncio.create_task(client._read())
        return client

    @property
    def rate(self) -> int:
        return AUDIO_KINDS[self.kind]

    def heard_ms(self) -> float:
        return len(self.received) * 1000 / (self.rate * 2)

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                header = await self.reader.readexactly(3)
                length = int.from_bytes(header[1:], "big")
                payload = await self.reader.readexactly(length)
                kind = header[0]
                self.kinds_received.add(kind)
                if kind == 0x00:  # Asterisk's AudioSocket() returns; anything after it is never read
                    self.hangup_received = True
                    while await self.reader.read(4096):
                        pass
                    self.closed_by_bridge = not self.hung_up
                    return
                if kind not in AUDIO_KINDS:
                    self.warnings.append(f"kind 0x{kind:02x} from the bridge")  # Asterisk would end the session
                    continue
                if kind != self.kind or not payload:
                    self.warnings.append(f"audio kind 0x{kind:02x}, {len(payload)} bytes")
                now = loop.time()
                self._play_end = max(self._play_end, now) + len(payload) / (self.rate * 2)
                self.max_ahead_ms = max(self.max_ahead_ms, (self._play_end - now) * 1000 - len(payload) * 1000 / (self.rate * 2))
                self.received += payload
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_bridge = not self.hung_up

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def talk(self, duration_ms: int, speech: bytes = b"", at_ms: int = 0, dtmf: dict[int, str] | None = None) -> None:
        """``duration_ms`` of 20 ms frames at real time: silence, with ``speech`` (PCM16 at the stream rate)
        from ``at_ms`` and the digits of ``dtmf`` at their times. Stops early if the bridge closes."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        frame_bytes = self.rate * FRAME_MS // 1000 * 2
        speech_start = at_ms * self.rate // 1000 * 2
        pending = dict(dtmf or {})
        for i in range(duration_ms // FRAME_MS):
            if self.closed_by_bridge or self.hangup_received:
                return
            offset = i * frame_bytes
            chunk = speech[offset - speech_start : offset - speech_start + frame_bytes] if offset >= speech_start else b""
            data = frame(self.kind, chunk.ljust(frame_bytes, b"\x00"))
            for at, digit in list(pending.items()):
                if at <= i * FRAME_MS:
                    data += frame(0x03, digit.encode())
                    del pending[at]
            with contextlib.suppress(ConnectionError):
                await self.send(data)
            await asyncio.sleep(max(0.0, t0 + (i + 1) * FRAME_MS / 1000 - loop.time()))

    async def hang_up(self) -> None:
        """Current Asterisk ends a session by closing the socket."""
        self.hung_up = True
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        if self._reader_task is not None:
            await asyncio.wait({self._reader_task}, timeout=2)

    async def wait_closed(self, timeout_s: float = 5.0) -> None:
        assert self._reader_task is not None
        await asyncio.wait_for(asyncio.shield(self._reader_task), timeout_s)


@dataclass
class Bridge:
    state: BridgeState
    listener: AudioSocketListener
    engine: RecordingEngine

    @property
    def services(self) -> BridgeServices:
        return self.state.services

    @property
    def port(self) -> int:
        assert self.listener.port is not None
        return self.listener.port

    def metric(self, name: str, **labels: str) -> float:
        return self.state.registry.get_sample_value(name, labels) or 0.0


@contextlib.asynccontextmanager
async def bridge(recorder: RecordingEngine | None = None, *, max_calls: int = 100, **audiosocket: Any) -> AsyncIterator[Bridge]:
    recorder = recorder or engine()
    config = settings(audiosocket={"enabled": True, "port": free_port(), **audiosocket}, server={"max_calls": max_calls})
    state = BridgeState(config, recorder, None)
    async with AudioSocketListener(state.services) as listener:
        yield Bridge(state, listener, recorder)
    await recorder.aclose()


async def test_the_carrier_is_registered_with_a_listener_and_no_routes() -> None:
    carrier = load_carrier(carrier_spec("audiosocket"))
    assert carrier.listener is AudioSocketListener and carrier.router is None and carrier.rest is None


async def test_disabled_listens_nowhere() -> None:
    state = BridgeState(settings(), engine(), None)
    async with AudioSocketListener(state.services) as listener:
        assert listener.port is None


async def test_conversation_at_8k_paced_within_the_small_lead() -> None:
    async with bridge() as b:
        caller = await Asterisk.connect(b.port)
        await caller.talk(4000, short_speech(1500), at_ms=300)
        await caller.hang_up()
        await until(lambda: b.engine.session_count == 0 or known(b.services.registry, str(caller.call_id)))
    assert caller.warnings == [] and caller.kinds_received == {0x10}
    assert 1000 <= caller.heard_ms() <= 3700  # the echo agent said the utterance back
    assert caller.max_ahead_ms <= PROFILE.lead_ms + FRAME_MS, caller.max_ahead_ms  # the lead, plus a frame of jitter
    (session_id,) = b.engine.opened
    acks = [c for c in b.engine.commands[session_id] if isinstance(c, AckPlayback)]
    assert acks and abs(acks[-1].played_ms - caller.heard_ms()) <= FRAME_MS  # what was played, within a frame
    assert b.engine.resumed == []


async def test_slin16_stream_is_answered_in_slin16() -> None:
    async with bridge(engine(agent="tone")) as b:
        caller = await Asterisk.connect(b.port, kind=0x12)
        await caller.talk(1500)
        await caller.hang_up()
    assert caller.warnings == [] and caller.kinds_received == {0x12}
    assert 500 <= caller.heard_ms() <= 800  # the tone agent's greeting, at 16 kHz
    assert caller.max_ahead_ms <= PROFILE.lead_ms + FRAME_MS


async def test_dtmf_reaches_the_engine() -> None:
    async with bridge() as b:
        caller = await Asterisk.connect(b.port)
        await caller.talk(800, dtmf={200: "5", 400: "#"})
        await caller.hang_up()
    assert b.engine.of(CreateTextItem) == [CreateTextItem("DTMF 5"), CreateTextItem("DTMF #")]


async def test_the_bridge_hangs_up_in_band() -> None:
    async with bridge() as b:
        caller = await Asterisk.connect(b.port)
        talking = asyncio.create_task(caller.talk(5000))
        await until(lambda: b.engine.session_count == 1)
        await b.engine.sessions[b.engine.opened[0]].close("agent_ended_the_call")
        await caller.wait_closed()
        await talking
        assert await b.services.registry.ended_reason(str(caller.call_id)) is not None
    assert caller.hangup_received and caller.warnings == []


async def test_a_dropped_connection_resumes_the_same_session_with_the_same_uuid() -> None:
    async with bridge(engine(agent="tone")) as b:
        first = await Asterisk.connect(b.port)
        await first.talk(1000)
        await first.hang_up()  # the socket drops; the dialplan loops back to AudioSocket(<same uuid>)
        await until(lambda: known(b.services.registry, str(first.call_id)))
        second = await Asterisk.connect(b.port, first.call_id)
        await second.talk(1000)
        await second.hang_up()
    assert b.engine.opened == b.engine.resumed == [b.engine.opened[0]]
    assert first.heard_ms() + second.heard_ms() <= 800  # the greeting once, not replayed


async def test_an_immediate_reconnect_still_resumes() -> None:
    """The dialplan loops back within a millisecond: the new connection waits for the old one to detach."""
    async with bridge(engine(agent="tone")) as b:
        first = await Asterisk.connect(b.port)
        await first.talk(600)
        await first.hang_up()
        second = await Asterisk.connect(b.port, first.call_id)
        await second.talk(600)
        await second.hang_up()
    assert len(b.engine.opened) == 1 and b.engine.resumed == b.engine.opened


async def test_a_new_connection_supersedes_a_half_open_one() -> None:
    async with bridge(engine(agent="tone")) as b:
        first = await Asterisk.connect(b.port)
        await first.talk(400)  # then silent, socket left open (a half-open connection)
        second = await Asterisk.connect(b.port, first.call_id)
        await second.talk(600)
        await first.wait_closed()
        await second.hang_up()
    assert first.closed_by_bridge and len(b.engine.opened) == 1 and b.engine.resumed == b.engine.opened


async def test_caller_hang_up_sends_nothing_more() -> None:
    async with bridge() as b:
        caller = await Asterisk.connect(b.port)
        await caller.talk(300)
        await caller.hang_up()
        await until(lambda: known(b.services.registry, str(caller.call_id)))
        # a close is all AudioSocket says: the engine session waits out the grace for a reconnect
        assert b.engine.of(CloseSession) == [] and b.engine.session_count == 1
        assert await b.services.registry.ended_reason(str(caller.call_id)) is None


async def test_a_silent_connection_counts_as_dropped_and_resumes() -> None:
    """A half-open connection (Asterisk gone without a FIN) sends nothing: after ``idle_timeout_s`` the bridge
    detaches the session, and the dialplan's next ``AudioSocket()`` resumes it."""
    async with bridge(engine(agent="tone"), idle_timeout_s=0.3) as b:
        first = await Asterisk.connect(b.port)
        await first.talk(400)  # then nothing, socket left open
        await first.wait_closed(3.0)
        assert await known(b.services.registry, str(first.call_id))
        second = await Asterisk.connect(b.port, first.call_id)
        await second.talk(400)
        await second.hang_up()
    assert first.closed_by_bridge and b.engine.resumed == b.engine.opened == [b.engine.opened[0]]


class TestAdmission:
    async def test_a_source_outside_allowed_sources_is_closed_at_once(self) -> None:
        async with bridge(allowed_sources=["10.0.0.0/8"]) as b:
            caller = await Asterisk.connect(b.port)
            await caller.wait_closed(2.0)
            refused = b.metric("callbridge_streams_refused_total", provider="audiosocket", reason="source_not_allowed")
        assert caller.closed_by_bridge and refused == 1 and b.engine.opened == []

    async def test_no_uuid_in_time(self) -> None:
        async with bridge(first_frame_timeout_s=0.2) as b:
            caller = await Asterisk.connect(b.port, send_uuid=False)
            await caller.wait_closed(2.0)
            refused = b.metric("callbridge_streams_refused_total", provider="audiosocket", reason="first_frame_timeout")
        assert caller.closed_by_bridge and refused == 1 and b.engine.opened == []

    async def test_a_uuid_and_then_no_audio(self) -> None:
        async with bridge(first_frame_timeout_s=0.3) as b:
            caller = await Asterisk.connect(b.port)
            await caller.wait_closed(2.0)
            refused = b.metric("callbridge_streams_refused_total", provider="audiosocket", reason="first_audio_timeout")
        assert caller.closed_by_bridge and refused == 1 and b.engine.opened == []

    async def test_capacity_refuses_new_calls_but_not_a_returning_one(self) -> None:
        async with bridge(engine(agent="tone"), max_calls=1) as b:
            first = await Asterisk.connect(b.port)
            talking = asyncio.create_task(first.talk(1500))
            await until(lambda: len(b.services.active_calls) == 1)
            other = await Asterisk.connect(b.port)
            await other.wait_closed(2.0)
            refused = b.metric("callbridge_streams_refused_total", provider="audiosocket", reason="capacity")
            await talking
            await first.hang_up()
            await until(lambda: not b.services.active_calls)
            again = await Asterisk.connect(b.port, first.call_id)
            await again.talk(400)
            await again.hang_up()
        assert other.closed_by_bridge and refused == 1
        assert b.engine.resumed == b.engine.opened == [b.engine.opened[0]]


BAD_INPUT = {
    "garbage_first": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "unknown_event", False),
    "audio_before_uuid": (frame(0x10, bytes(320)), "out_of_order", False),
    "short_uuid": (b"\x01\x00\x04abcd", "bad_field", False),
    "unknown_kind_too_long": (b"\x42\x01\x01", "unknown_event", True),
    "second_uuid": (frame(0x01, bytes(16)), "out_of_order", True),
    "kind_change": (frame(0x12, bytes(640)), "unsupported_format", True),
    "odd_pcm": (frame(0x10, bytes(321)), "bad_field", True),
    "bad_dtmf": (frame(0x03, b"x"), "bad_field", True),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
async def test_bad_input_ends_that_call_cleanly(case: str) -> None:
    data, reason, after_start = BAD_INPUT[case]
    async with bridge(engine(agent="tone")) as b:
        bystander = await Asterisk.connect(b.port)
        bystander_talk = asyncio.create_task(bystander.talk(1500))
        caller = await Asterisk.connect(b.port, send_uuid=after_start)
        if after_start:
            await caller.talk(300)
            await until(lambda: len(b.services.active_calls) == 2)
        await caller.send(data)
        await caller.wait_closed()
        errors = b.metric("callbridge_carrier_protocol_errors_total", provider="audiosocket", reason=reason)
        await bystander_talk
        await bystander.hang_up()
    assert errors == 1 and caller.closed_by_bridge
    assert caller.hangup_received is after_start  # a bound call is hung up in band before the close
    assert bystander.warnings == [] and not bystander.closed_by_bridge and 500 <= bystander.heard_ms() <= 800


async def test_shutdown_closes_live_connections_and_keeps_their_sessions() -> None:
    recorder = engine(agent="tone")
    async with bridge(recorder) as b:
        caller = await Asterisk.connect(b.port)
        talking = asyncio.create_task(caller.talk(3000))
        await until(lambda: len(b.services.active_calls) == 1)
    await caller.wait_closed()
    await talking
    assert caller.closed_by_bridge and await known(b.services.registry, str(caller.call_id))


@pytest.mark.parametrize(
    ("host", "allowed"),
    [("127.0.0.1", True), ("::1", True), ("::ffff:127.0.0.1", True), ("10.1.2.3", False), ("", False), ("fe80::1", False)],
)
def test_source_allowed(host: str, allowed: bool) -> None:
    import ipaddress

    networks: list[Any] = [ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("::1/128")]
    assert source_allowed(host, networks) is allowed


def test_a_bad_cidr_is_a_config_error() -> None:
    from callbridge.config import ConfigError, load_settings

    with pytest.raises(ConfigError) as exc:
        load_settings(overrides={"audiosocket": {"allowed_sources": ["10.0.0.300/8"]}})
    assert "10.0.0.300/8" in str(exc.value)

