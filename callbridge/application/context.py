"""``CallContext``: who is calling and how the call reached the bridge, one typed record whatever the carrier.

Each carrier builds it from what its answer webhook (or, where it has none, its stream's first message) says; the
application receives it in the ``assistant-request`` and with every call event, and the call's first log line shows it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CallContext", "allowed_parameters", "call_context", "e164"]

_E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")
_MAX_PARAMETERS = 32
_MAX_VALUE_CHARS = 512


class CallContext(BaseModel):
    """The call, as the application sees it. Numbers are E.164 (``+15551234567``) where the carrier gives one that
    parses as such, else as the carrier wrote them (a SIP URI's user part, ``anonymous``); None where it said none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    call_id: str = Field(max_length=128)
    """The bridge's id of the call: its logs, registry and events use it (the carrier's call id)."""
    carrier: str = Field(max_length=32)
    """The carrier's name in callbridge: its ``CarrierSpec.name`` (``sip`` for a SIP trunk)."""
    carrier_call_id: str | None = Field(default=None, max_length=256)
    """The carrier's own id where it differs from ``call_id`` (a call-session id beside the leg's, SIP's Call-ID)."""
    direction: Literal["inbound", "outbound"] = "inbound"
    caller_number: str | None = Field(default=None, max_length=256)
    called_number: str | None = Field(default=None, max_length=256)
    caller_name: str | None = Field(default=None, max_length=256)
    forwarded_from: str | None = Field(default=None, max_length=256)
    account_id: str | None = Field(default=None, max_length=256)
    parameters: dict[str, str] = Field(default_factory=dict)
    """The call's own parameters that ``app.context_parameters`` lets through: custom parameters, client state,
    extra headers, SIP ``X-`` headers (their names as the carrier gives them)."""
    dial_id: str | None = Field(default=None, max_length=64)
    """A call the agent placed (``POST /calls``): the id its request was answered with."""
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    """A call the agent placed: the request's metadata, in every event of the call."""
    ring_ms: int | None = None
    """A call the agent placed, answered: how long it rang (the carrier's ringing report → its answer webhook)."""

    def log_fields(self) -> dict[str, object]:
        """What the call's first log line shows of it (the parameters by name only: their values may be private)."""
        return {
            "carrier": self.carrier,
            "direction": self.direction,
            "caller": self.caller_number,
            "called": self.called_number,
            "caller_name": self.caller_name,
            "forwarded_from": self.forwarded_from,
            "parameters": sorted(self.parameters),
        }


def e164(number: str | None, *, plus_implied: bool = False) -> str | None:
    """``number`` in E.164 where it is one (spaces, dashes, dots and brackets dropped; a ``tel:`` or ``sip:``
    user part taken), else as given, trimmed; None for nothing. ``plus_implied``: the carrier writes E.164
    without its ``+`` (``14155550100``)."""
    if number is None:
        return None
    raw = number.strip()
    if not raw:
        return None
    user = raw
    for scheme in ("tel:", "sip:", "sips:"):
        if user.lower().startswith(scheme):
            user = user[len(scheme) :].split("@", 1)[0].split(";", 1)[0]
    digits = re.sub(r"[\s\-.()]", "", user)
    if plus_implied and digits.isdigit():
        digits = "+" + digits
    return digits if _E164.match(digits) else raw[:256]


def allowed_parameters(given: Mapping[str, str] | Iterable[tuple[str, str]], allowed: Iterable[str]) -> dict[str, str]:
    """The parameters named in ``allowed`` (case-insensitive, as headers are), values cut to 512 characters, at
    most 32: what a caller or carrier sends beyond that never reaches the application."""
    wanted = {name.lower() for name in allowed}
    items = given.items() if isinstance(given, Mapping) else given
    kept: dict[str, str] = {}
    for name, value in items:
        if name.lower() in wanted and len(kept) < _MAX_PARAMETERS:
            kept[name] = str(value)[:_MAX_VALUE_CHARS]
    return kept


def _text(value: object) -> str | None:
    return value[:256] or None if isinstance(value, str) else None


def call_context(
    *,
    call_id: str,
    carrier: str,
    caller: object = None,
    called: object = None,
    caller_name: object = None,
    forwarded_from: object = None,
    account_id: object = None,
    outbound: bool = False,
    plus_implied: bool = False,
    carrier_call_id: object = None,
    parameters: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    allowed: Iterable[str] = (),
) -> CallContext:
    """A carrier's webhook fields made a ``CallContext``: numbers in E.164 where they are, text cut to its bounds,
    anything not a string dropped, only the ``allowed`` parameters kept. The fields come from a signed webhook,
    but are the caller's to choose (a caller name, a SIP header): a call is never refused over them."""
    return CallContext(
        call_id=call_id[:128],
        carrier=carrier,
        carrier_call_id=_text(carrier_call_id),
        direction="outbound" if outbound else "inbound",
        caller_number=e164(_text(caller), plus_implied=plus_implied),
        called_number=e164(_text(called), plus_implied=plus_implied),
        caller_name=_text(caller_name),
        forwarded_from=e164(_text(forwarded_from), plus_implied=plus_implied),
        account_id=_text(account_id),
        parameters=allowed_parameters(parameters, allowed),
    )
