"""``CallContext``: who is calling and how the call reached the bridge, one typed record whatever the carrier.

Each carrier builds it from what its answer webhook (or, where it has none, its stream's first message) says; the
application receives it in the ``assistant-request`` and with every call event, and the call's first log line shows it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CallContext", "allowed_parameters", "e164"]

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
    """The carrier's name in callbridge (``twilio``, ``telnyx``, ``sip``…)."""
    carrier_call_id: str | None = Field(default=None, max_length=256)
    """The carrier's own id where it differs from ``call_id`` (Telnyx's call_session_id, SIP's Call-ID)."""
    direction: Literal["inbound", "outbound"] = "inbound"
    caller_number: str | None = Field(default=None, max_length=256)
    called_number: str | None = Field(default=None, max_length=256)
    caller_name: str | None = Field(default=None, max_length=256)
    forwarded_from: str | None = Field(default=None, max_length=256)
    account_id: str | None = Field(default=None, max_length=256)
    parameters: dict[str, str] = Field(default_factory=dict)
    """The call's own parameters that ``app.context_parameters`` lets through: custom parameters, client state,
    extra headers, SIP ``X-`` headers (their names as the carrier gives them)."""

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


def e164(number: str | None) -> str | None:
    """``number`` in E.164 where it is one (spaces, dashes, dots and brackets dropped; a ``tel:`` or ``sip:``
    user part taken), else as given, trimmed; None for nothing."""
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
    if _E164.match(digits):
        return digits
    if digits.isdigit() and len(digits) == 11 and digits.startswith("1"):  # NANP written without its plus
        return "+" + digits
    return raw[:256]


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
