"""What an application asks for when the agent is to place a call (``POST /calls``, #42): to and from, through which
carrier, how long it may ring, what to do about an answering machine, the assistant, and metadata echoed in every
event of the call. Validated whole before anything is dialled: a bad request is refused with its reason, never sent
to a carrier to find out."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from callbridge.application import AssistantConfig, MachineDetection

__all__ = ["MAX_METADATA_KEYS", "Calls", "DialAccepted", "DialRefusal", "DialRequest", "MetadataValue"]

MAX_METADATA_KEYS: Final = 16
_E164: Final = re.compile(r"^\+[1-9][0-9]{6,14}$")

MetadataValue = str | int | float | bool | None
"""A metadata value: a JSON scalar (strings at most 512 characters)."""


class DialRequest(BaseModel):
    """One call to place. ``to`` and ``from`` are E.164 numbers (``+15551230000``); ``from`` must be one the carrier
    lets the account call from (the carrier says so, and the call fails with its reason)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    carrier: Annotated[str, StringConstraints(min_length=1, max_length=32)]
    """The carrier to dial through, by its name in callbridge (its spec's)."""
    to: str
    from_: str = Field(alias="from")
    ring_timeout_s: Annotated[int, Field(ge=5, le=120)] | None = None
    """How long it rings unanswered before it is given up; None: ``outbound.ring_timeout_s``."""
    machine_detection: Literal["off", "hang_up", "voicemail"] = "off"
    """What an answering machine gets: ``off``, the agent talks to whoever answers; else the agent's audio is held
    until the bridge knows who answered (``MachineDetection``) — ``hang_up``, the call ends once a machine is known;
    ``voicemail``, ``voicemail_message`` is said after its beep, then the call ends."""
    voicemail_message: Annotated[str, StringConstraints(max_length=2000)] | None = None
    """What the model is told to say to a machine (an instruction, as a greeting is)."""
    on_uncertain: Literal["person", "machine"] = "person"
    """Nobody heard (or no decision in time): taken for this."""
    assistant: AssistantConfig | None = None
    """The call's assistant; None: the application is asked, as for an inbound call (``direction`` outbound)."""
    metadata: dict[Annotated[str, StringConstraints(min_length=1, max_length=64)], MetadataValue] = Field(default_factory=dict)
    """Echoed in every event of the call (``CallContext.metadata``)."""

    @field_validator("to", "from_")
    @classmethod
    def _e164(cls, number: str) -> str:
        if not _E164.match(number):
            raise ValueError("not an E.164 number (+ and 7 to 15 digits)")
        return number

    @model_validator(mode="after")
    def _voicemail_has_a_message(self) -> DialRequest:
        if self.machine_detection == "voicemail" and not self.voicemail_message:
            raise ValueError("machine_detection voicemail needs a voicemail_message")
        return self

    def detection(self) -> MachineDetection | None:
        """What the call does about an answering machine, for its assistant; None: nothing."""
        if self.machine_detection == "off":
            return None
        return MachineDetection(mode=self.machine_detection, voicemail_message=self.voicemail_message, on_uncertain=self.on_uncertain)

    @field_validator("metadata")
    @classmethod
    def _small(cls, metadata: dict[str, MetadataValue]) -> dict[str, MetadataValue]:
        if len(metadata) > MAX_METADATA_KEYS:
            raise ValueError(f"at most {MAX_METADATA_KEYS} keys")
        if any(isinstance(value, str) and len(value) > 512 for value in metadata.values()):
            raise ValueError("a value is longer than 512 characters")
        return metadata


@dataclass(frozen=True, slots=True)
class DialAccepted:
    """Taken: ``dial_id`` names the call in the application's events (``CallContext.dial_id``); ``queued_behind``
    calls wait before it for the carrier's rate or a slot (0: dialled now)."""

    dial_id: str
    queued_behind: int


@dataclass(frozen=True, slots=True)
class DialRefusal:
    """Not taken, and why (``POST /calls`` answers ``status`` with it)."""

    reason: str
    detail: str
    status: int


class Calls(Protocol):
    """The calls the agent places, as a Python application (``app.module``) has them: its ``started(calls)`` hook
    gets this as the bridge starts. ``place`` is ``POST /calls`` without HTTP: taken (the call's progress then comes
    to the application's ``event`` hook) or refused with the reason, at once."""

    def place(self, request: DialRequest) -> DialAccepted | DialRefusal: ...

    def cancel(self, dial_id: str) -> Literal["canceled", "canceling", "answered", "not_found"]:
        """Give up on a call placed (``DELETE /calls/{dial_id}``): never dialled (``canceled``), or canceled at the
        carrier while it rings (``canceling``: ``call.failed`` follows); too late once ``answered``."""
        ...
