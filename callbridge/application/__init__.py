"""The voice agent's application surface: what callbridge tells the application about a call (``CallContext``),
what the application answers (``AssistantReply``), how the two trust each other (``verify_signature``), and how
the bridge reaches it (a webhook or a Python module: ``hooks``). Imports nothing of the bridge: an application
imports this package alone."""

from callbridge.application.assistant import (
    AssistantConfig,
    AssistantReply,
    BargeInTaking,
    MachineDetection,
    Tool,
    ToolResult,
    TurnTaking,
)
from callbridge.application.context import CallContext
from callbridge.application.signing import SIGNATURE_HEADER, sign, verify_signature

__all__ = ["SIGNATURE_HEADER", "AssistantConfig", "AssistantReply", "BargeInTaking", "CallContext", "MachineDetection", "Tool", "ToolResult", "TurnTaking", "sign", "verify_signature"]
