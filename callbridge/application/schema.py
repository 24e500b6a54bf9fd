"""The JSON Schema of what callbridge sends the application and what it answers, as published in
``docs/application-schema.json`` (``callbridge app-schema`` prints it): for teams writing the webhook in any language."""

from __future__ import annotations

from typing import Any

from callbridge.application.assistant import AssistantReply
from callbridge.application.context import CallContext

__all__ = ["application_schema"]


def application_schema() -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "callbridge application",
        "description": (
            "callbridge POSTs {\"type\": \"assistant-request\", \"call\": CallContext} to app.webhook_url, signed in the "
            "Callbridge-Signature header (t=<unix s>,v1=<hex HMAC-SHA256 of '<t>.<body>' with app.webhook_secret>); "
            "the application answers AssistantReply."
        ),
        "$defs": {
            "AssistantRequest": {
                "type": "object",
                "properties": {"type": {"const": "assistant-request"}, "call": {"$ref": "#/$defs/CallContext"}},
                "required": ["type", "call"],
            },
            "CallContext": CallContext.model_json_schema(ref_template="#/$defs/{model}"),
            **_flattened(AssistantReply.model_json_schema(ref_template="#/$defs/{model}")),
        },
    }


def _flattened(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's schema with its own ``$defs`` lifted beside it."""
    defs = schema.pop("$defs", {})
    return {**defs, schema["title"]: schema}
