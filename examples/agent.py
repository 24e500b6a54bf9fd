"""A voice agent's application as a Python module: ``callbridge serve --set app.module=examples.agent:app`` (or
``callbridge simulate --app examples.agent:app``). It looks the caller up by number and greets them by name.

The same application as a webhook, in any language: ``examples/agent_webhook.py``.
"""

from __future__ import annotations

from callbridge.application import AssistantConfig, AssistantReply, CallContext

CUSTOMERS = {"+15005550006": "Ada", "+919800000001": "Grace"}
"""Your CRM here: the caller's number → their name."""
BLOCKED = {"+15005550009"}


class Agent:
    async def assistant(self, call: CallContext) -> AssistantConfig | AssistantReply:
        if call.caller_number in BLOCKED:
            return AssistantReply(reject="busy")
        name = CUSTOMERS.get(call.caller_number or "")
        who = f"The caller is {name}, a customer." if name else "The caller is not a known customer."
        return AssistantConfig(
            instructions=f"You are Acme's receptionist. {who} Keep answers short: this is a phone call.",
            greeting=f"Greet {name} by name and ask how you can help." if name else "Greet the caller and ask how you can help.",
        )


app = Agent()
