"""Python applications (``app.module``) for the end-to-end tests: each records the calls it was asked about."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from callbridge.application import AssistantConfig, AssistantReply, CallContext, Tool
from callbridge.application.events import CallEvent
from callbridge.outbound import Calls

INSTRUCTIONS = "You are Acme's receptionist."
GREETING = "Greet the caller by the number they called from and ask how you can help."


class Greeter:
    """Greets each caller; its instructions name the number called."""

    calls: ClassVar[list[CallContext]] = []

    async def assistant(self, call: CallContext) -> AssistantConfig:
        Greeter.calls.append(call)
        return AssistantConfig(instructions=f"{INSTRUCTIONS} The caller dialled {call.called_number}.", greeting=GREETING)


class Slow:
    """Answers after 5 s: well past the deadline."""

    async def assistant(self, call: CallContext) -> AssistantConfig:
        await asyncio.sleep(5)
        return AssistantConfig(instructions="too late")


class Failing:
    async def assistant(self, call: CallContext) -> AssistantConfig:
        raise RuntimeError("the order database is down")


class Busy:
    async def assistant(self, call: CallContext) -> AssistantReply:
        return AssistantReply(reject="busy")


class HangsUp:
    async def assistant(self, call: CallContext) -> AssistantReply:
        return AssistantReply(reject="hang_up")


ORDER_TOOL = "look_up_order"


class Orders:
    """An assistant with one tool of its own; the tool answers at once, slowly, or fails, by the call's digit."""

    calls: ClassVar[list[tuple[str, dict[str, object]]]] = []
    delay_s: ClassVar[float] = 0.0
    fails: ClassVar[bool] = False

    async def assistant(self, call: CallContext) -> AssistantConfig:
        tool = Tool(name=ORDER_TOOL, description="Look up the caller's order", parameters={"type": "object", "properties": {}})
        return AssistantConfig(tools=(tool,), tool_filler="Say you are looking it up.")

    async def tool(self, call: CallContext, name: str, arguments: dict[str, object]) -> str:
        Orders.calls.append((name, arguments))
        await asyncio.sleep(Orders.delay_s)
        if Orders.fails:
            raise RuntimeError("orders database down")
        return '{"order": "A-17", "status": "shipped"}'


class Recorder(Greeter):
    """``Greeter``, and every call event it is sent."""

    events: ClassVar[list[CallEvent]] = []

    async def event(self, call: CallContext, event: CallEvent) -> None:
        Recorder.events.append(event)


class RecordsAndUploads(Recorder):
    """``Recorder``, recording each call and naming where it goes (``upload_url``) and what comes back."""

    upload_url: ClassVar[str] = ""

    async def assistant(self, call: CallContext) -> AssistantConfig:
        chosen = await super().assistant(call)
        mine = {"recording": True, "recording_upload_url": self.upload_url, "metadata": {"crm_id": 42}}
        return AssistantConfig.model_validate({**chosen.model_dump(exclude_unset=True), **mine})


class Transfers:
    """Sends every call on to the front desk."""

    target: ClassVar[str] = "+15550100"

    async def assistant(self, call: CallContext) -> AssistantReply:
        return AssistantReply(transfer=self.target)


class Listens:
    """Answers with the configured assistant and takes every call event (the benchmarks' event load: nothing about
    the call changes)."""

    events: ClassVar[int] = 0

    async def assistant(self, call: CallContext) -> AssistantConfig:
        return AssistantConfig()

    async def event(self, call: CallContext, event: CallEvent) -> None:
        Listens.events += 1


class Brief(Recorder):
    """``Recorder``, with calls of at most two seconds."""

    async def assistant(self, call: CallContext) -> AssistantConfig:
        chosen = await super().assistant(call)
        return AssistantConfig.model_validate({**chosen.model_dump(exclude_unset=True), "max_duration_s": 2.0})


class Patient(Recorder):
    """Waits 1.2 s of silence before the caller's turn ends (callers who read out numbers); no greeting; in Spanish,
    a voice of the model's own; every call event recorded (``Recorder.events``)."""

    async def assistant(self, call: CallContext) -> AssistantConfig:
        return AssistantConfig.model_validate(
            {"greeting": "", "turn_taking": {"silence_duration_ms": 1200}, "language": "Spanish", "engine_options": {"tts_speaker": "Ryan"}}
        )


class CallsOut:
    """For the calls the agent places: each call it is asked about, and every event with its call's context."""

    asked: ClassVar[list[CallContext]] = []
    events: ClassVar[list[tuple[CallContext, CallEvent]]] = []

    async def assistant(self, call: CallContext) -> AssistantConfig:
        CallsOut.asked.append(call)
        return AssistantConfig(instructions=f"{INSTRUCTIONS} You called {call.called_number}.", greeting=GREETING)

    async def event(self, call: CallContext, event: CallEvent) -> None:
        CallsOut.events.append((call, event))


class PlacesCalls(CallsOut):
    """``CallsOut``, keeping what places calls (its ``started`` hook's)."""

    calls: ClassVar[Calls | None] = None

    async def started(self, calls: Calls) -> None:
        PlacesCalls.calls = calls
