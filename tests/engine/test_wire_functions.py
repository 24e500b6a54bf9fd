"""Function calls on the wire, against vllm-omni 0.30.0's own code: the tools we declare reach its session
config, the events it emits for a model's function call parse into one ``FunctionCall``, and the output we
send back passes its ``invalid_function_call_output`` checks. Then the embedded engine end to end."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callbridge.bridge.actions import telephony_tools
from callbridge.engine.commands import CreateTextItem, FunctionCallOutput
from callbridge.engine.events import (
    EngineErrorEvent,
    FunctionCall,
    ItemCreated,
    ResponseCreated,
    ResponseDone,
)
from callbridge.engine.local.agents import ActionsAgent
from callbridge.engine.local.core import LocalEngineOptions, LocalSessionCore
from callbridge.engine.port import SessionConfig
from callbridge.engine.wire import (
    InputFormat,
    command_to_wire,
    parse_client_command,
    parse_server_event,
    session_config_from_wire,
    session_update,
)
from tests.engine.vllm_omni_wheel import load_vllm_omni

TOOLS = telephony_tools(["+15550100"])


@pytest.fixture
def omni() -> None:
    load_vllm_omni()


def _function_call_events(call_id: str, name: str, arguments: str) -> tuple[Any, list[Any]]:
    from vllm_omni.engine.duplex.realtime_events import (
        RealtimeProjectionState,
        _function_call_done_events,
    )

    state = RealtimeProjectionState(session_id="duplex-1")
    event = {"type": "function_call.done", "session_id": "duplex-1", "epoch": 0, "call_id": call_id, "name": name, "arguments": arguments}
    return state, _function_call_done_events(state, event)


@pytest.mark.usefixtures("omni")
class TestAgainstVllmOmni:
    def test_tools_reach_the_session_config(self) -> None:
        from vllm_omni.engine.duplex.config import DuplexSessionConfig

        payload = session_update(SessionConfig(input_rate_hz=8000, tools=TOOLS))["session"]
        resolved = DuplexSessionConfig.from_realtime(payload)
        assert resolved.extra_body["realtime_tools"] == [dict(t) for t in TOOLS]
        assert resolved.extra_body["realtime_tool_choice"] == "auto"
        assert "tools" not in session_update(SessionConfig())["session"]  # none declared: none sent

    def test_a_function_call_parses_once_from_everything_it_emits(self) -> None:
        _, events = _function_call_events("call_7", "transfer_call", '{"target": "+15550100"}')
        wire_types = [e.to_realtime()["type"] for e in events]
        assert "response.function_call_arguments.done" in wire_types and "response.output_item.done" in wire_types
        parsed = [parse_server_event(e.to_realtime()).event for e in events]
        calls = [p for p in parsed if isinstance(p, FunctionCall)]
        assert len(calls) == 1
        call = calls[0]
        assert (call.name, call.call_id, call.arguments) == ("transfer_call", "call_7", {"target": "+15550100"})
        response_created = next(p for p in parsed if isinstance(p, ResponseCreated))
        assert call.response_id == response_created.response_id
        assert any(isinstance(p, ResponseDone) and p.status == "completed" for p in parsed)

    def test_arguments_that_are_not_a_json_object_still_parse(self) -> None:
        _, events = _function_call_events("call_8", "send_dtmf", "digits=12")
        call = next(p for p in (parse_server_event(e.to_realtime()).event for e in events) if isinstance(p, FunctionCall))
        assert call.arguments == {} and call.raw_arguments == "digits=12"

    def test_our_output_passes_vllm_omnis_checks(self) -> None:
        from vllm_omni.engine.duplex.commands import command_from_realtime
        from vllm_omni.engine.duplex.realtime_events import resolve_create_item
        from vllm_omni.protocol.duplex import RealtimeInputDefaults

        state, _ = _function_call_events("call_7", "end_call", "{}")
        command = command_from_realtime(command_to_wire(FunctionCallOutput("call_7", '{"ok":true}')), defaults=RealtimeInputDefaults())
        assert type(command).__name__ == "CreateItem"
        resolved = resolve_create_item(state, command)
        assert resolved.events == []
        assert resolved.payloads[0]["payload"]["item"]["type"] == "function_call_output"
        assert resolved.payloads[0]["payload"]["item"]["output"] == '{"ok":true}'

    def test_an_output_for_an_unknown_call_is_what_vllm_omni_rejects(self) -> None:
        from vllm_omni.engine.duplex.commands import command_from_realtime
        from vllm_omni.engine.duplex.realtime_events import resolve_create_item
        from vllm_omni.protocol.duplex import RealtimeInputDefaults

        state, _ = _function_call_events("call_7", "end_call", "{}")
        command = command_from_realtime(command_to_wire(FunctionCallOutput("call_x", "{}")), defaults=RealtimeInputDefaults())
        errors = [e.to_realtime() for e in resolve_create_item(state, command).events]
        assert errors and errors[0]["error"]["code"] == "invalid_function_call_output"
        # the error parses to the typed event the bridge logs
        assert parse_server_event(errors[0]).event == EngineErrorEvent("invalid_function_call_output", errors[0]["error"]["message"], False, errors[0]["error"].get("event_id"))


class TestOurServerSide:
    def test_function_call_round_trip(self) -> None:
        from callbridge.engine.projection import WireProjection

        call = FunctionCall("send_dtmf", "call_1", {"digits": "123"}, '{"digits": "123"}', "resp-1")
        parsed = [parse_server_event(payload).event for payload in WireProjection("duplex-1").project(call)]
        assert [event for event in parsed if isinstance(event, FunctionCall)] == [call]  # once, of all it sends

    def test_function_call_output_round_trip(self) -> None:
        output = FunctionCallOutput("call_1", '{"ok":true}')
        assert parse_client_command(command_to_wire(output), InputFormat()) == output

    def test_an_output_that_is_not_text_is_refused(self) -> None:
        from callbridge.engine.errors import EngineError

        bad = {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c", "output": {"ok": True}}}
        with pytest.raises(EngineError) as caught:
            parse_client_command(bad, InputFormat())
        assert caught.value.code == "invalid_function_call_output"

    def test_tools_survive_session_update(self) -> None:
        config, _ = session_config_from_wire(SessionConfig(tools=TOOLS).to_realtime())
        assert [t["name"] for t in config.tools] == ["end_call", "send_dtmf", "transfer_call"]


class TestEmbeddedActionsAgent:
    def core(self, tools: tuple[dict[str, Any], ...] = TOOLS) -> LocalSessionCore:
        core = LocalSessionCore("duplex-t", SessionConfig(tools=tools), ActionsAgent(), LocalEngineOptions(agent="actions"), 0)
        core.events_to_send()
        return core

    @pytest.mark.parametrize(
        ("key", "name", "arguments"),
        [("#", "end_call", {}), ("*", "transfer_call", {"target": "+15550100"}), ("0", "send_dtmf", {"digits": "123"})],
    )
    def test_keys_call_the_declared_tools(self, key: str, name: str, arguments: dict[str, str]) -> None:
        core = self.core()
        core.submit(CreateTextItem(f"DTMF {key}"), 10)
        events = core.events_to_send()
        assert [type(e) for e in events] == [ItemCreated, FunctionCall]
        call = events[1]
        assert isinstance(call, FunctionCall) and (call.name, call.arguments) == (name, arguments)
        assert json.loads(call.raw_arguments) == arguments
        core.submit(FunctionCallOutput(call.call_id, '{"ok":true}'), 20)
        (output,) = core.events_to_send()
        assert isinstance(output, ItemCreated) and output.item["type"] == "function_call_output"
        core.submit(FunctionCallOutput(call.call_id, '{"ok":true}'), 30)  # twice: as vllm-omni, an error
        assert [e.code for e in core.events_to_send() if isinstance(e, EngineErrorEvent)] == ["invalid_function_call_output"]

    def test_undeclared_tools_are_never_called(self) -> None:
        core = self.core(tools=())
        core.submit(CreateTextItem("DTMF #"), 10)
        core.submit(CreateTextItem("DTMF *"), 10)
        assert [type(e) for e in core.events_to_send()] == [ItemCreated, ItemCreated]  # the digits, no call

    def test_an_output_for_no_call_is_an_error(self) -> None:
        core = self.core()
        core.submit(FunctionCallOutput("call_nope", "{}"), 10)
        assert [e.code for e in core.events_to_send() if isinstance(e, EngineErrorEvent)] == ["invalid_function_call_output"]


async def test_a_tool_call_over_the_wire_client_and_engine_server() -> None:
    """The wire client (``realtime.py``) against a real ``engine-server`` with the ``actions`` agent: tools go out
    in ``session.update``, the call comes back typed, the output is accepted (no error), a second one is not."""
    from callbridge.engine.realtime import RealtimeEngine
    from tests.engine.serving import engine_server

    async with engine_server(LocalEngineOptions(agent="actions")) as running:
        engine = RealtimeEngine(running.url)
        session = await engine.open(SessionConfig(input_rate_hz=8000, tools=TOOLS))
        await session.create_text_item("DTMF 0")
        events = session.events()
        call = None
        async for event in events:
            if isinstance(event, FunctionCall):
                call = event
                break
        assert call is not None and (call.name, call.arguments) == ("send_dtmf", {"digits": "123"})
        await session.submit(FunctionCallOutput(call.call_id, '{"ok":true}'))
        await session.submit(FunctionCallOutput(call.call_id, '{"ok":true}'))
        async for event in events:
            if isinstance(event, EngineErrorEvent):
                assert event.code == "invalid_function_call_output"
                break
        (local,) = running.engine._sessions.values()
        assert local._core.function_outputs == {call.call_id: '{"ok":true}'}
        await session.close()
        await engine.aclose()
