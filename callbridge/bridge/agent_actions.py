"""The agent's function calls on one call stream, sans-I/O (``CallSession`` composes it): each is the application's
tool (done by the application: ``Perform``), a call action (``bridge/actions.py``: ``end_call``, ``transfer_call``,
``send_dtmf``, checked against the policy; carrier work is ``Perform``), or refused with a result the model hears.
While the call is ending or a transfer is under way every other call is answered busy.
"""

from __future__ import annotations

from callbridge.bridge.actions import (
    ActionResult,
    ApplicationToolCall,
    CarrierCallAction,
    EndCall,
    TransferCall,
    parse_call,
)
from callbridge.bridge.call_outputs import CallOutput, PendingAction, Perform, ToEngine
from callbridge.engine.commands import FunctionCallOutput
from callbridge.engine.events import FunctionCall

__all__ = ["AgentActions"]


class AgentActions:
    """The agent's function calls under way on a stream, and what to say while one is slow. See the module
    docstring."""

    __slots__ = ("call_actions", "transfer_targets", "running", "application_tools", "tool_filler", "_fillers_said", "closing_after_transfer")

    def __init__(self, call_actions: bool, transfer_targets: tuple[str, ...]) -> None:
        self.call_actions = call_actions
        """The agent may act on the call (``end_call``, ``send_dtmf``, ``transfer_call``); off: every call refused."""
        self.transfer_targets = transfer_targets
        self.running: dict[str, CarrierCallAction | ApplicationToolCall] = {}
        """The calls under way, by the model's call id."""
        self.application_tools: frozenset[str] = frozenset()
        self.tool_filler: str | None = None
        self._fillers_said: set[str] = set()
        """Application tool calls whose filler the agent was told to say."""
        self.closing_after_transfer = False
        """The carrier's ``stop`` came while a transfer was under way: the engine session is closed when its result
        comes, after the model is told it; or by the stream's end, if it never comes."""

    def bound(self, application_tools: frozenset[str], tool_filler: str | None) -> None:
        """The call's application tools (their calls go to the application) and what the agent says while one is slow."""
        self.application_tools, self.tool_filler = application_tools, tool_filler

    @property
    def transferring(self) -> bool:
        return any(isinstance(action, TransferCall) for action in self.running.values())

    def function_call(self, call: FunctionCall, out: list[CallOutput], *, ending: bool) -> bool:
        """The model called a function: its result, or the work to perform, goes to ``out``. ``ending``: the call is
        ending (the agent asked to hang up). True: the call is to end once the agent's audio has played (``end_call``)."""
        if call.name in self.application_tools:
            if self._refused_busy(call, out, ending=ending):
                return False
            tool = ApplicationToolCall(call.name, dict(call.arguments))
            self.running[call.call_id] = tool
            out.append(Perform(PendingAction(call.call_id, tool)))
            return False
        action = (
            parse_call(call, self.transfer_targets)
            if self.call_actions
            else ActionResult.failed("unknown_tool", "call actions are disabled")
        )
        if isinstance(action, ActionResult):
            out.append(ToEngine(FunctionCallOutput(call.call_id, action.output())))
        elif isinstance(action, EndCall):
            out.append(ToEngine(FunctionCallOutput(call.call_id, ActionResult.done().output())))
            return True
        elif not self._refused_busy(call, out, ending=ending):
            self.running[call.call_id] = action
            out.append(Perform(PendingAction(call.call_id, action)))
        return False

    def _refused_busy(self, call: FunctionCall, out: list[CallOutput], *, ending: bool) -> bool:
        """While the call is ending or a transfer is under way, the call is answered busy (True)."""
        if not ending and not self.transferring:
            return False
        busy = "the call is ending" if ending else "a transfer is in progress"
        out.append(ToEngine(FunctionCallOutput(call.call_id, ActionResult.failed("busy", busy).output())))
        return True

    def finished(self, call_id: str) -> CarrierCallAction | ApplicationToolCall | None:
        """The call ``call_id`` is done (None: not one under way); its filler, if said, is forgotten."""
        self._fillers_said.discard(call_id)
        return self.running.pop(call_id, None)

    def filler_due(self, call_id: str) -> str | None:
        """What the agent is to say while the application's tool ``call_id`` is slow: the filler, once per call."""
        if self.tool_filler is None or call_id not in self.running or call_id in self._fillers_said:
            return None
        return self.tool_filler

    def filler_said(self, call_id: str) -> None:
        self._fillers_said.add(call_id)

    def stream_stopped(self) -> bool:
        """The carrier's ``stop`` came: True where a transfer is under way (most likely the transfer's own doing: a
        carrier stops the stream as the transfer lands), and the model hears its result before the session closes."""
        if not self.transferring:
            return False
        self.closing_after_transfer = True
        return True
