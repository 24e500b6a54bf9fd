"""A voice agent's application as a Python module: ``callbridge serve --set app.module=examples.agent:app`` (or
``callbridge simulate --app examples.agent:app``). It looks the caller up by number and greets them by name,
answers the model's order look-ups, records each call and logs its report.

The same application as a webhook, in any language: ``examples/agent_webhook.py``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from callbridge.application import AssistantConfig, AssistantReply, CallContext, Tool
from callbridge.application.events import CallEvent

log = logging.getLogger("agent")

CUSTOMERS = {"+15005550006": "Ada", "+919800000001": "Grace"}
"""Your CRM here: the caller's number → their name."""
ORDERS = {"Ada": {"order": "A-17", "status": "shipped, arriving Thursday"}}
BLOCKED = {"+15005550009"}
LOOK_UP_ORDER = Tool(
    name="look_up_order",
    description="Look up the caller's latest order and its status.",
    parameters={"type": "object", "properties": {}},
)


class Agent:
    async def assistant(self, call: CallContext) -> AssistantConfig | AssistantReply:
        if call.caller_number in BLOCKED:
            return AssistantReply(reject="busy")
        name = CUSTOMERS.get(call.caller_number or "")
        who = f"The caller is {name}, a customer." if name else "The caller is not a known customer."
        return AssistantConfig(
            instructions=f"You are Acme's receptionist. {who} Keep answers short: this is a phone call.",
            greeting=f"Greet {name} by name and ask how you can help." if name else "Greet the caller and ask how you can help.",
            tools=(LOOK_UP_ORDER,),
            tool_filler="Tell the caller you are looking it up.",
            recording=True,
            metadata={"customer": name},
        )

    async def tool(self, call: CallContext, name: str, arguments: dict[str, Any]) -> str:
        order = ORDERS.get(CUSTOMERS.get(call.caller_number or "", ""))
        return json.dumps(order or {"error": "no order found for this caller"})

    async def event(self, call: CallContext, event: CallEvent) -> None:
        if event.type == "call.ended":
            report = event.data["report"]
            log.info("call %s ended by %s after %d ms: %d turns, recording %s", call.call_id, report["ended_by"],
                     report["duration_ms"], report["turns"], report["recording"])  # fmt: skip


app = Agent()
