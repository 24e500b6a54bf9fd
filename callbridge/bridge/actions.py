"""The agent's call actions: the telephony tools declared to the model, its calls checked against them, and the
results that go back to it (issue #8 item 4).

With ``call_actions.enabled`` every call's session declares three functions
(``telephony_tools``): ``end_call``, ``send_dtmf{digits}`` and, when
``call_actions.transfer_targets`` is not empty, ``transfer_call{target}``
whose ``target`` is an enum of exactly those targets. ``parse_call`` checks a
``FunctionCall`` once more against the policy (a model may send anything): an
unknown tool, a target not in the allow-list or digits outside 0-9 * # A-D
come back as a refusal, never reach a carrier.

``end_call`` is the call core's own (hang up once the agent's audio has
played). ``TransferCall`` and ``SendDtmf`` are carrier work the driver hands
to the carrier's ``CallActionPerformer`` (a REST client, or the SIP
listener); a carrier without one answers ``unsupported``. Every result goes
back to the model as a ``function_call_output``: ``{"ok": true}`` or
``{"error": "<code>", "detail": "…"}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from callbridge.engine.events import FunctionCall

__all__ = [
    "DTMF_DIGITS",
    "END_CALL",
    "MAX_DTMF_DIGITS",
    "SEND_DTMF",
    "TRANSFER_CALL",
    "ActionResult",
    "AgentAction",
    "ApplicationToolCall",
    "CallActionPerformer",
    "CarrierCallAction",
    "EndCall",
    "SendDtmf",
    "TransferCall",
    "parse_call",
    "telephony_tools",
]

END_CALL: Final = "end_call"
TRANSFER_CALL: Final = "transfer_call"
SEND_DTMF: Final = "send_dtmf"
DTMF_DIGITS: Final = "0123456789*#ABCD"
MAX_DTMF_DIGITS: Final = 32


def telephony_tools(transfer_targets: Sequence[str]) -> tuple[dict[str, Any], ...]:
    """The tools every call's session declares (Realtime function tools, JSON Schema parameters)."""
    tools: list[dict[str, Any]] = [
        {
            "type": "function",
            "name": END_CALL,
            "description": "Hang up the phone call once you have finished speaking (say goodbye first).",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
        {
            "type": "function",
            "name": SEND_DTMF,
            "description": "Press keys on the phone line (an IVR menu, an extension): DTMF digits 0-9, *, #, A-D.",
            "parameters": {
                "type": "object",
                "properties": {
                    "digits": {"type": "string", "pattern": f"^[0-9*#A-D]{{1,{MAX_DTMF_DIGITS}}}$", "description": "The keys, in order."}
                },
                "required": ["digits"],
                "additionalProperties": False,
            },
        },
    ]
    if transfer_targets:
        tools.append(
            {
                "type": "function",
                "name": TRANSFER_CALL,
                "description": "Transfer the caller to a person or department; the call leaves you if it succeeds.",
                "parameters": {
                    "type": "object",
                    "properties": {"target": {"type": "string", "enum": list(transfer_targets), "description": "Where to transfer."}},
                    "required": ["target"],
                    "additionalProperties": False,
                },
            }
        )
    return tuple(tools)


@dataclass(frozen=True, slots=True)
class EndCall:
    """Hang up once the agent's audio has played (the call core does it)."""


@dataclass(frozen=True, slots=True)
class TransferCall:
    """Hand the call to ``target`` (one of ``call_actions.transfer_targets``)."""

    target: str


@dataclass(frozen=True, slots=True)
class SendDtmf:
    """Send ``digits`` to the far end of the call (RFC 4733 on SIP, the carrier's command elsewhere)."""

    digits: str


@dataclass(frozen=True, slots=True)
class ApplicationToolCall:
    """The model called one of the application's tools (``AssistantConfig.tools``): the application answers."""

    name: str
    arguments: Mapping[str, Any]


CarrierCallAction = TransferCall | SendDtmf
AgentAction = EndCall | CarrierCallAction | ApplicationToolCall


@dataclass(frozen=True, slots=True)
class ActionResult:
    """How an action ended, as the model hears it (``output``).

    ``call_left``: the call has left the bridge with the action (a transfer through a carrier's REST API: the
    carrier runs new instructions and our stream ends); the bridge must not hang it up.
    """

    ok: bool
    error: str | None = None
    detail: str | None = None
    call_left: bool = False
    text: str | None = None
    """An application tool's own output, given to the model as it is."""

    @classmethod
    def answered(cls, text: str) -> ActionResult:
        """An application tool's output."""
        return cls(True, text=text)

    @classmethod
    def done(cls, *, call_left: bool = False, detail: str | None = None) -> ActionResult:
        return cls(True, None, detail, call_left)

    @classmethod
    def failed(cls, error: str, detail: str | None = None) -> ActionResult:
        return cls(False, error, detail)

    @classmethod
    def unsupported(cls, provider: str, what: str) -> ActionResult:
        return cls(False, "unsupported", f"{provider} calls cannot {what} from the bridge")

    def output(self) -> str:
        """The ``function_call_output`` text: ``{"ok": true}`` or ``{"error": …, "detail": …}``; an application
        tool's output as it answered it."""
        if self.text is not None:
            return self.text
        body: dict[str, Any] = {"ok": True} if self.ok else {"error": self.error or "failed"}
        if self.detail:
            body["detail"] = self.detail
        return json.dumps(body, separators=(",", ":"))


def parse_call(call: FunctionCall, transfer_targets: Sequence[str]) -> AgentAction | ActionResult:
    """The action a model's function call asks for, or the refusal to send back (never raises)."""
    args: Mapping[str, Any] = call.arguments
    if call.name == END_CALL:
        return EndCall()
    if call.name == SEND_DTMF:
        digits = args.get("digits")
        if isinstance(digits, int) and not isinstance(digits, bool):
            digits = str(digits)
        if not isinstance(digits, str) or not 0 < len(digits) <= MAX_DTMF_DIGITS or any(d not in DTMF_DIGITS for d in digits.upper()):
            return ActionResult.failed("bad_arguments", f"digits must be 1-{MAX_DTMF_DIGITS} of {DTMF_DIGITS}")
        return SendDtmf(digits.upper())
    if call.name == TRANSFER_CALL:
        target = args.get("target")
        if not transfer_targets:
            return ActionResult.failed("unknown_tool", "transfer_call is not available")
        if not isinstance(target, str) or target not in transfer_targets:
            return ActionResult.failed("target_not_allowed", f"target must be one of {list(transfer_targets)}")
        return TransferCall(target)
    return ActionResult.failed("unknown_tool", f"no tool named {call.name!r}")


class CallActionPerformer(Protocol):
    """What a carrier does for the agent: its REST client or its listener (SIP) implements it."""

    async def perform(self, call_id: str, account_id: str | None, action: CarrierCallAction) -> ActionResult:
        """Do ``action`` on the call and say how it went; a carrier that cannot do it returns
        ``ActionResult.unsupported``. Raises only on an unexpected failure (the driver reports it)."""
        ...
