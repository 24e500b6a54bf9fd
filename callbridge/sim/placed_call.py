"""One call the agent places, simulated end to end (``callbridge simulate --outbound``, #42): a bridge and the engine in
this process, ``POST /calls`` to it, the simulated carrier's REST dial ringing a scripted callee — a person who says
``speech`` and waits, a voicemail that says it as its greeting and then beeps, a line that is busy or rings out."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np

from callbridge.application.events import CallEvent
from callbridge.config import Settings
from callbridge.outbound_http import http_client
from callbridge.sim.callee import Callee
from callbridge.sim.caller import CallerScript, CallResult
from callbridge.sim.runner import running_bridge, with_overrides

__all__ = ["CALLEE_KINDS", "PlacedCall", "beep", "simulate_placed_call", "voicemail_answer"]

CalleeKind = Literal["person", "voicemail", "busy", "no-answer"]
CALLEE_KINDS: Final[tuple[CalleeKind, ...]] = ("person", "voicemail", "busy", "no-answer")
_TO: Final = "+15005550123"
_FROM: Final = "+15005550006"
_BEEP_MS: Final = 400
_REPORT_WAIT_S: Final = 5.0


@dataclass
class PlacedCall:
    """What came of it: the bridge's answer to the request, the callee's side (None where nobody answered), and the
    events the application was sent."""

    answer: dict[str, Any]
    result: CallResult | None
    events: list[CallEvent] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    """What the carrier reported of the call, in order (its status callbacks: ``ringing``, ``busy``…)."""


def beep(ms: int = _BEEP_MS, hz: float = 1000.0) -> bytes:
    """A voicemail's beep: a tone, PCM16 8 kHz."""
    t = np.arange(8 * ms) / 8000
    return (6000 * np.sin(2 * np.pi * hz * t)).astype("<i2").tobytes()


def voicemail_answer(greeting: bytes, *, beep_after_ms: int = 300) -> bytes:
    """A voicemail's answer: ``greeting`` (PCM16 8 kHz), ``beep_after_ms`` of silence, a 400 ms beep at 1 kHz."""
    return greeting + bytes(16 * beep_after_ms) + beep()


def first_words(speech: bytes, *, pause_ms: int = 100) -> tuple[bytes, bytes]:
    """``speech`` (PCM16 8 kHz) split at its first pause of ``pause_ms`` (a frame under 30 dB each): what a person
    says as they pick up ("Hello,"), and the rest."""
    pcm = np.frombuffer(speech[: len(speech) // 320 * 320], dtype="<i2").astype(np.float64).reshape(-1, 160)
    quiet = 20 * np.log10(np.sqrt((pcm**2).mean(axis=1)) + 1e-9) < 30
    frames = pause_ms // 20
    for k in range(1, len(quiet) - frames):
        if not quiet[k - 1] and quiet[k : k + frames].all():
            return speech[: k * 320], speech[k * 320 :]
    return speech, b""


def callee_for(kind: CalleeKind, speech: bytes, speak_at_ms: int, hangup_at_ms: int | None) -> Callee:
    """The callee ``kind`` says ``speech`` ``speak_at_ms`` after answering: a voicemail as its greeting; a person its
    first words as they pick up, and the rest 1.5 s after (once the agent has spoken)."""
    match kind:
        case "busy":
            return Callee(outcome="busy", ring_ms=1000)
        case "no-answer":
            return Callee(outcome="no_answer")
        case "voicemail":
            return Callee(ring_ms=1000, script=CallerScript(utterances=((speak_at_ms, voicemail_answer(speech)),), hangup_at_ms=hangup_at_ms or 30_000))
    hello, rest = first_words(speech)
    said = [(speak_at_ms, hello)]
    if rest:
        said.append(((speak_at_ms + len(hello) // 16 + 1500) // 20 * 20, rest))
    return Callee(ring_ms=1000, script=CallerScript(utterances=tuple(said), hangup_at_ms=hangup_at_ms))


async def simulate_placed_call(settings: Settings, provider: str, callee: Callee, request: dict[str, Any]) -> PlacedCall:
    """``request`` (a ``DialRequest``'s fields but the carrier and numbers) placed through a bridge in this process,
    ``provider``'s simulator ringing ``callee``; waits for the call to be over and its report."""
    token = secrets.token_hex(16)
    settings = with_overrides(settings, {"outbound": {"api_token": token}})
    async with running_bridge(settings, provider=provider) as bridge:
        events: list[CallEvent] = []
        delivery = bridge.app.state.bridge.services.events
        if delivery is not None:
            delivery.observers.append(lambda _call, event: events.append(event))
        bridge.carrier.callees[_TO] = callee
        body = {**request, "carrier": provider, "to": _TO, "from": _FROM}
        async with http_client(timeout=10.0) as http:
            response = await http.post(f"{bridge.base_url}/calls", json=body, headers={"Authorization": f"Bearer {token}"})
        answer = response.json()
        if response.status_code != 202:
            return PlacedCall(answer, None, events)
        while not bridge.carrier.dialled_at:
            await asyncio.sleep(0.02)
        (ringing,) = bridge.carrier.dialled.values()
        result = await ringing
        deadline = time.monotonic() + _REPORT_WAIT_S
        while delivery is not None and not any(e.type in ("call.ended", "call.failed") for e in events) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return PlacedCall(answer, result, events, [status for _, status in bridge.carrier.status_reports])
