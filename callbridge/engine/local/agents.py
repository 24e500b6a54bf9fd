"""The embedded engine's agents: what it says, and when.

An agent is pure: it turns the caller's finished utterance (PCM16 at 16 kHz)
into the agent's reply (PCM16 at 24 kHz, the rate MiniCPM-o and Qwen3-Omni
speak at), or streams input straight back. The session core does the rest
(turns, responses, chunking, barge-in).

- ``echo``: says each utterance back once the caller's turn ends — a real
  conversation loop for the demo and the end-to-end tests.
- ``loopback``: each input chunk straight back, at once — for latency and load tests.
- ``tone``: a short two-note greeting when the session opens, then listens.
- ``actions``: ``echo``, and a scripted tool caller for tests and demos of the
  agent's call actions: the caller's keys (the bridge's ``DTMF <d>`` text
  items) call the telephony tools the session declared — ``#`` → ``end_call``,
  ``*`` → ``transfer_call`` to the first target its schema allows, ``0`` →
  ``send_dtmf`` ``"123"``, ``1`` → the first other tool declared (an
  application's: ``{"digit": "1"}``). A tool the session did not declare is
  not called. A tool's output, once a response is asked for, is said.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import soxr

__all__ = ["AGENTS", "OUTPUT_RATE_HZ", "ActionsAgent", "Agent", "EchoAgent", "LoopbackAgent", "ToneAgent"]

OUTPUT_RATE_HZ: Final = 24000
_INPUT_RATE_HZ: Final = 16000


class Agent:
    """Base agent: silent. Subclasses override what they react to."""

    name = "silent"
    streams_input = False
    """True: every input chunk is answered at once (``stream``); turns are not answered."""

    def greeting(self) -> tuple[bytes, str] | None:
        """Audio (PCM16 24 kHz) and transcript to say when the session opens, or None."""
        return None

    def reply(self, utterance: bytes) -> tuple[bytes, str] | None:
        """Audio and transcript answering ``utterance`` (PCM16 16 kHz), or None to stay silent."""
        return None

    def say(self, text: str) -> tuple[bytes, str]:
        """Audio and transcript for a text turn the bridge asked a response to (the greeting): the embedded engine
        has no voice, so a chime as long as the text would take to say (60 ms a character, 0.3 to 3 s)."""
        return spoken_stand_in(len(text)), text

    def call_for_text(self, text: str, tools: Mapping[str, Mapping[str, Any]]) -> tuple[str, dict[str, Any]] | None:
        """The tool call (name, arguments) a user text item makes, among the declared ``tools`` (by name), or None."""
        return None


class EchoAgent(Agent):
    name = "echo"

    def reply(self, utterance: bytes) -> tuple[bytes, str] | None:
        if not utterance:
            return None
        samples = np.frombuffer(utterance, dtype="<i2")
        out = soxr.resample(samples, _INPUT_RATE_HZ, OUTPUT_RATE_HZ, quality="HQ")
        return out.astype("<i2").tobytes(), f"(echo of {len(samples) * 1000 // _INPUT_RATE_HZ} ms)"


class ActionsAgent(EchoAgent):
    """``echo``, plus tool calls scripted on the caller's keys (module docstring)."""

    name = "actions"

    def call_for_text(self, text: str, tools: Mapping[str, Mapping[str, Any]]) -> tuple[str, dict[str, Any]] | None:
        key = text.removeprefix("DTMF ").strip() if text.startswith("DTMF ") else None
        if key == "#" and "end_call" in tools:
            return "end_call", {}
        if key == "0" and "send_dtmf" in tools:
            return "send_dtmf", {"digits": "123"}
        if key == "1":
            other = [name for name in tools if name not in ("end_call", "send_dtmf", "transfer_call")]
            return (other[0], {"digit": "1"}) if other else None
        if key == "*" and "transfer_call" in tools:
            parameters = tools["transfer_call"].get("parameters") or {}
            target = (parameters.get("properties") or {}).get("target") or {}
            targets = target.get("enum") or []
            return ("transfer_call", {"target": targets[0]}) if targets else None
        return None


class LoopbackAgent(Agent):
    name = "loopback"
    streams_input = True


class ToneAgent(Agent):
    name = "tone"

    def greeting(self) -> tuple[bytes, str] | None:
        return two_note_chime(), "(greeting chime)"


def spoken_stand_in(characters: int) -> bytes:
    """``Agent.say``'s audio: the two-note chime stretched to 60 ms a character (0.3 to 3 s), PCM16 at 24 kHz."""
    note_ms = max(150, min(1500, characters * 30))
    return two_note_chime(note_ms=note_ms, gap_ms=0)


def two_note_chime(note_ms: int = 300, gap_ms: int = 60) -> bytes:
    """Two sine notes (660 Hz, 880 Hz) with 10 ms fades, PCM16 at 24 kHz."""
    rate = OUTPUT_RATE_HZ
    t = np.arange(rate * note_ms // 1000) / rate
    fade = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.01)
    notes = [np.sin(2 * np.pi * f * t) * fade * 8000 for f in (660.0, 880.0)]
    gap = np.zeros(rate * gap_ms // 1000)
    return np.concatenate([notes[0], gap, notes[1]]).astype("<i2").tobytes()


AGENTS: Final[dict[str, type[Agent]]] = {"echo": EchoAgent, "loopback": LoopbackAgent, "tone": ToneAgent, "actions": ActionsAgent}
