"""What a carrier is to the rest of callbridge: a ``CarrierSpec``, the one record the app, carrier detection, the
CLI, the configuration and the simulators read (``callbridge.carriers.CARRIERS``). The ``Carrier`` its HTTP side
or listener brings is the bridge's plug-in type (``callbridge.bridge.carrier_plugin``); its simulator is the
simulators' (``callbridge.sim.simulators.simulator_class``); its far end for the fault simulator is ``FarEnd`` here.

A spec names its package's modules by reference (``"http:CARRIER"``), imported when first asked for: reading
the registry (``--help``, detection's list, the configuration's secrets) imports no carrier's HTTP side, and
no carrier module imports the registry back. The registry imports nothing above it either, not even for types:
what it names of the bridge and the simulators it names by reference, and its own types are local.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from callbridge.carriers.base import ProviderCodec

__all__ = ["Capabilities", "CarrierSpec", "FarEnd", "FarEndMessage", "Transport", "UpgradeCheck", "UpgradeProof"]

Transport = Literal["websocket", "tcp", "sip", "webrtc"]
"""How the carrier's media reaches the bridge: a websocket (and so the generic ``/media`` URL too), a raw
TCP stream, SIP and RTP, a browser's peer connection."""


@dataclass(frozen=True, slots=True)
class UpgradeProof:
    """What a carrier's own proof on a media upgrade (a signature, credentials) says, at the generic ``/media``
    URL, where the carrier is not known yet."""

    refusal: str | None = None
    """The proof is there and wrong (``bad_signature``, ``bad_credentials``…); None: it admits the upgrade."""
    token_needed: bool = True
    """Admitted, the stream must still carry a token our answer minted (a signature over a URL without parameters
    is the same for every call); False where the proof is the carrier's own admission (configured credentials)."""


UpgradeCheck = Callable[[str, "Mapping[str, str]", "str | None"], "UpgradeProof | None"]
"""``(url, headers, peer)`` → what this carrier's proof on the upgrade says; None: the request carries none."""


FarEndMessage = tuple[Literal["media"], bytes] | tuple[Literal["mark"], str] | tuple[Literal["clear"], None]


class FarEnd(Protocol):
    """A marking carrier's side of one media stream as messages on its wire, pure: what the carrier sends (its
    stream's opening, μ-law 8 kHz media, a mark's echo, the stop) and what it reads of what the bridge sends.
    A carrier's ``sim.py`` writes it; its spec names it (``CarrierSpec.far_end``)."""

    def codec(self) -> ProviderCodec:
        """The bridge's codec for this carrier's stream."""

    def opening(self, stream_number: int, call_id: str) -> list[str | bytes]:
        """The call's ``stream_number``-th stream's first messages, up to and with the one that starts the media."""

    def media(self, stream_id: str, ulaw: bytes, media_ms: int) -> str | bytes:
        """20 ms of caller audio, ``media_ms`` into the stream."""

    def mark_echo(self, stream_id: str, name: str) -> str | bytes:
        """The mark ``name`` has played."""

    def stop(self, stream_id: str) -> str | bytes:
        """The caller hung up."""

    def read(self, stream_id: str, message: str | bytes) -> FarEndMessage | str:
        """What the carrier makes of a message from the bridge on stream ``stream_id``: audio to play, a mark, a
        clear; a str: the warning the carrier raises instead (the message breaks its protocol)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the carrier can do on a live call (the simulator and the codec's profile are checked against these)."""

    marks: bool
    """It plays what it is sent and echoes our marks as it plays them."""
    flush: bool
    """It empties its playback buffer when told (``clear``): a barge-in stops the agent at once."""
    reconnect: bool
    """A dropped media connection comes back on the same call, and the engine session resumes."""
    dtmf_out: bool
    """The agent can send digits on the call."""
    transfer: bool
    """The agent can transfer the call."""


@dataclass(frozen=True, slots=True)
class CarrierSpec:
    """One carrier, as everything outside its package knows it."""

    name: str
    """Its name in URLs, metrics, logs, ``--provider`` and the registry; its package is ``callbridge.carriers.<name>``."""
    transport: Transport
    capabilities: Capabilities
    section: str | None
    """Its settings section (``[<name>]``); None: it has none."""
    secret: str | None
    """The key of ``section`` that holds the account's secret: what a simulated account signs with."""
    carrier: str
    """Its ``Carrier`` (routes, REST, listener), ``"module:name"`` in ``package``."""
    codec: str | None
    """Where its media is a websocket: its codec's factory (no arguments), ``"module:name"``; the generic
    ``/media`` URL recognises the carrier and takes this codec."""
    simulator: str | None
    """Its ``SimulatedCarrier`` class, ``"module:name"``; None: not simulated on its own."""
    builds_on: str | None = None
    """The one other carrier whose package this one's may import (a dialect of it); None: none
    (``tests/test_import_contracts.py`` holds every other carrier's package out of this one's)."""
    sockets: tuple[Literal["udp", "tcp"], ...] = ()
    """Where the carrier has a listener of its own beside the HTTP server: the transports it binds on its section's
    ``host`` and ``port`` when the section's ``enabled`` is on (checked before start by ``preflight``; run by
    worker 0 alone under ``--workers``)."""
    recognises: str | None = None
    """Where its media is a websocket: ``"module:name"`` of a predicate that says whether a first message (parsed
    JSON) is this carrier's (``generic.wire.Recognises``), for the generic ``/media`` URL; None: not recognised
    there."""
    far_end: str | None = None
    """Where the carrier plays what it is sent and echoes marks: ``"module:name"`` of its side of a media stream as
    pure messages (``FarEnd``), for the deterministic fault simulator; None: none."""
    direct_protocol: str | None = None
    """Where its simulator can call straight onto any server that speaks its media websocket (a voice bot, no
    answer webhook: ``loadtest --ws-url``, ``SimulatedCarrier.direct``), that protocol's name; None: it cannot."""

    @property
    def package(self) -> str:
        """The package that holds everything of it (``callbridge.carriers.<name>``)."""
        return f"callbridge.carriers.{self.name}"

    def load(self, reference: str) -> Any:
        """What ``reference`` (``"module:name"``) names in the carrier's package, imported now."""
        module, _, name = reference.partition(":")
        return getattr(importlib.import_module(f"{self.package}.{module}"), name)

    def codec_factory(self) -> Callable[[], ProviderCodec]:
        if self.codec is None:
            raise LookupError(f"{self.name} has no codec of its own")
        factory: Callable[[], ProviderCodec] = self.load(self.codec)
        return factory

    def recogniser(self) -> Callable[[Mapping[str, Any]], bool]:
        if self.recognises is None:
            raise LookupError(f"{self.name} is not recognised on the generic media URL")
        recognises: Callable[[Mapping[str, Any]], bool] = self.load(self.recognises)
        return recognises

    def far_end_wire(self) -> FarEnd:
        if self.far_end is None:
            raise LookupError(f"{self.name} has no far end for the fault simulator")
        far_end: FarEnd = self.load(self.far_end)
        return far_end
