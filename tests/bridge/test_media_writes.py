"""What the driver sends the carrier in a row goes in one batch where the transport takes batches (a websocket:
one write, ``ws_protocol``): a reply's audio and the marker after it, in their order, with every other output
(engine commands, hang-ups) still done in the order the call produced it; a transport without batches gets the
same messages one by one; a failed batch is the carrier gone, as a failed send is."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest

from callbridge.bridge.app import BridgeState
from callbridge.bridge.call_outputs import ToCarrier, ToEngine
from callbridge.bridge.media import MediaStreamDriver
from callbridge.carriers.twilio.wire import TwilioCodec
from callbridge.engine.commands import Heartbeat
from tests.bridge.twilio_e2e import RawStream, engine, settings

pytestmark = pytest.mark.hot_path
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""

_CONNECTED = '{"event":"connected","protocol":"Call","version":"1.0.0"}'


class _Carrier:
    """A Twilio stream's far end: ``connected`` and ``start``; ``stop`` once a marker has come."""

    def __init__(self, stream: RawStream) -> None:
        self.stream = stream
        self.incoming: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self.sent: list[tuple[str | bytes, ...]] = []
        """Each send as it came: one message, or a batch."""
        self._stopped = False
        for message in (_CONNECTED, stream.start_message()):
            self.incoming.put_nowait(message)

    def _took(self, messages: tuple[str | bytes, ...]) -> None:
        self.sent.append(messages)
        if not self._stopped and any(b'"mark"' in (m if isinstance(m, bytes) else m.encode()) for m in messages):
            self._stopped = True
            self.incoming.put_nowait(f'{{"event":"stop","sequenceNumber":"9","streamSid":"{self.stream.sid}","stop":{{}}}}')
            self.incoming.put_nowait(None)

    async def receive(self) -> str | bytes | None:
        return await self.incoming.get()

    async def send(self, message: str | bytes) -> None:
        self._took((message,))

    async def close(self, code: int) -> None:
        self.incoming.put_nowait(None)


class _BatchingCarrier(_Carrier):
    async def send_many(self, messages: Sequence[str | bytes]) -> None:
        self._took(tuple(messages))


def _stream(n: int) -> RawStream:
    return RawStream(None, "MZ" + f"{n:032d}", "CA" + f"{n:032d}", "", "AC" + "3" * 32)  # type: ignore[arg-type]


def _event(message: str | bytes) -> str:
    return str(json.loads(message)["event"])


async def _run(carrier: _Carrier) -> None:
    recorded = engine("tone")  # speaks at once: audio and markers without a caller's word
    services = BridgeState(settings(), recorded, None).services
    await asyncio.wait_for(MediaStreamDriver(carrier, TwilioCodec(), services, check_token=False).run(), 10)
    await services.aclose_background()
    await recorded.aclose()


async def test_a_replys_audio_and_its_marker_go_to_the_carrier_in_one_batch() -> None:
    carrier = _BatchingCarrier(_stream(1))
    await _run(carrier)
    batches = [[_event(m) for m in batch] for batch in carrier.sent]
    marks = [batch for batch in batches if "mark" in batch]
    assert marks, batches  # the tone's reply was marked
    assert all(batch[batch.index("mark") - 1] == "media" for batch in marks), marks  # each right behind its audio
    assert all(len(batch) == 1 for batch in batches if "mark" not in batch)  # nothing else waits for company


async def test_a_transport_without_batches_gets_the_same_messages_one_by_one() -> None:
    carrier = _Carrier(_stream(2))
    await _run(carrier)
    assert all(len(sent) == 1 for sent in carrier.sent)
    assert "mark" in {_event(sent[0]) for sent in carrier.sent}


class _Recorder:
    """Stands in for the engine session: notes each command submitted, with what the carrier had by then."""

    def __init__(self, carrier: _Carrier) -> None:
        self.carrier = carrier
        self.submitted: list[tuple[str, int]] = []

    async def submit(self, command: object) -> None:
        self.submitted.append((type(command).__name__, len(self.carrier.sent)))

    def take_ready_events(self) -> list[object]:
        return []


async def test_every_output_is_still_done_in_the_calls_order_around_a_batch() -> None:
    """Carrier messages in a row form a batch; an engine command between them ends it, and is submitted after the
    messages before it and before those after it."""
    carrier = _BatchingCarrier(_stream(3))
    services = BridgeState(settings(), engine("tone"), None).services
    driver = MediaStreamDriver(carrier, TwilioCodec(), services, check_token=False)
    recorder = _Recorder(carrier)
    driver.session = recorder  # type: ignore[assignment]
    driver.call._out[:] = [ToCarrier("a"), ToCarrier("b"), ToEngine(Heartbeat()), ToCarrier("c"), ToCarrier("d"), ToCarrier("e")]
    await driver._send_outputs()
    assert carrier.sent == [("a", "b"), ("c", "d", "e")]
    assert recorder.submitted == [("Heartbeat", 1)]


class _FailingBatches(_BatchingCarrier):
    async def send_many(self, messages: Sequence[str | bytes]) -> None:
        raise ConnectionError("closed by the carrier")


async def test_a_failed_batch_is_the_carrier_gone_and_nothing_more_is_sent_to_it() -> None:
    carrier = _FailingBatches(_stream(4))
    services = BridgeState(settings(), engine("tone"), None).services
    driver = MediaStreamDriver(carrier, TwilioCodec(), services, check_token=False)
    recorder = _Recorder(carrier)
    driver.session = recorder  # type: ignore[assignment]
    driver.call._out[:] = [ToCarrier("a"), ToCarrier("b"), ToEngine(Heartbeat()), ToCarrier("c")]
    await driver._send_outputs()
    assert carrier.sent == []  # "c" was not tried: the carrier's side is closed
    assert recorder.submitted == [("Heartbeat", 0)]  # the engine still gets its command
    assert driver.call.link.send_failed_at_ms is not None  # the call knows its carrier is gone (``send_failed``)
