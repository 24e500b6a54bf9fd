"""A call the agent places from one bridge process, answered on another (#42): two bridges sharing a real Redis
registry, the simulated Twilio's webhooks for the call all sent to process B (the load balancer's choice) while A
placed it and paces its carrier. B reads the request from A's note, serves the call (the dial id, metadata and
assistant on it), and tells A how it went: A's application events are whole, and A's pacing slot is freed when the
call ends on B."""

from __future__ import annotations

import time
from typing import Any

import pytest

from callbridge.bridge.app import create_app
from callbridge.bridge.dialer import ApplicationCalls
from callbridge.carriers.twilio.sim import SimulatedTwilio
from callbridge.outbound import DialAccepted, DialRequest
from callbridge.sim.callee import Callee
from callbridge.sim.carrier import CallerScript
from callbridge.sim.ports import bound_socket
from callbridge.sim.runner import running_bridge, serving, with_overrides
from tests.bridge import agent_app
from tests.bridge.test_outbound_e2e import CALLEE, OURS, events_of, outbound_settings
from tests.bridge.twilio_e2e import engine, short_speech, until
from tests.redis_server import redis_url

__all__ = ["redis_url"]  # the fixture, imported for pytest

pytestmark = pytest.mark.usefixtures("_fresh_app")


@pytest.fixture
def _fresh_app() -> None:
    agent_app.CallsOut.asked.clear()
    agent_app.CallsOut.events.clear()


async def test_a_call_placed_on_one_process_is_answered_on_another(redis_url: str) -> None:
    registry = {"backend": "redis", "redis_url": redis_url}
    recorder = engine()
    async with running_bridge(outbound_settings(registry=registry), recorder, provider="twilio") as a:
        carrier = a.carrier
        assert isinstance(carrier, SimulatedTwilio)
        listener = bound_socket()
        b_url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        b_settings = with_overrides(a.settings, {"server": {"port": listener.getsockname()[1], "public_url": b_url}})
        async with serving(create_app(b_settings, recorder), listener):
            carrier.bridge_url = b_url  # the load balancer sends the call's streams to B
            carrier.callees[CALLEE] = Callee(ring_ms=300, script=CallerScript(utterances=((1500, short_speech(800)),), hangup_at_ms=4000))
            dialer_a = a.app.state.bridge.services.dialer
            assert dialer_a is not None
            calls = ApplicationCalls(dialer_a, b_url)  # the public URL, which the load balancer sends to B
            taken = calls.place(DialRequest.model_validate({"carrier": "twilio", "to": CALLEE, "from": OURS, "metadata": {"crm_id": 9}}))
            assert isinstance(taken, DialAccepted), taken
            dial_id = taken.dial_id
            await until(lambda: len(carrier.dialled) == 1)
            ((call_sid, ringing),) = carrier.dialled.items()
            result = await ringing
            assert result is not None, carrier.status_reports
            await until(lambda: "call.ended" in events_of(dial_id), timeout_s=5)
            await until(lambda: calls.cancel(dial_id) == "not_found", timeout_s=5)  # A freed the call's slot
    kinds = events_of(dial_id)
    assert kinds.count("call.dialing") == 1 and kinds.count("call.ringing") == 1, kinds
    assert "call.answered" in kinds and kinds[-1] == "call.ended" and "call.failed" not in kinds, kinds
    (asked,) = agent_app.CallsOut.asked  # B asked the application, with the placed call's context
    assert (asked.direction, asked.dial_id, asked.metadata, asked.call_id) == ("outbound", dial_id, {"crm_id": 9}, call_sid)
    assert result.agent_runs_ms, result.render()  # the callee heard the agent


async def test_two_processes_dialling_through_one_carrier_keep_its_rate_together(redis_url: str) -> None:
    """``outbound.calls_per_second`` 4 on each of two bridges sharing Redis, three calls asked of each at once: each
    process's pacer alone would let both first dials go at the same moment (8 a second at the carrier); the fleet's
    turns (``reserve_dial``) space all six about 262 ms apart (the interval and its 5 % margin), whichever process
    dials."""
    registry = {"backend": "redis", "redis_url": redis_url}
    outbound = {"calls_per_second": 4.0}
    async with running_bridge(outbound_settings(registry=registry, outbound=outbound), engine(), provider="twilio") as a:
        carrier = a.carrier
        assert isinstance(carrier, SimulatedTwilio)
        listener = bound_socket()
        b_url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        b_settings = with_overrides(a.settings, {"server": {"port": listener.getsockname()[1], "public_url": b_url}})
        b_app = create_app(b_settings, engine())
        async with serving(b_app, listener):
            released: list[tuple[str, float]] = []
            for name, app in (("a", a.app), ("b", b_app)):
                rest = app.state.bridge.services.carrier_rests["twilio"]
                dial = rest.dial

                async def timed(leg: Any, dial: Any = dial, name: str = name) -> str:  # when the fleet's turn let it go
                    released.append((name, time.monotonic()))
                    return await dial(leg)

                rest.dial = timed
            for n in range(6):
                carrier.callees[f"+1500555030{n}"] = Callee(outcome="busy", ring_ms=50)
            places = [
                ApplicationCalls(app.state.bridge.services.dialer, url).place
                for app, url in ((a.app, a.base_url), (b_app, b_url))
            ]
            taken = [places[n % 2](DialRequest.model_validate({"carrier": "twilio", "to": f"+1500555030{n}", "from": OURS})) for n in range(6)]
            assert all(isinstance(t, DialAccepted) for t in taken), taken
            await until(lambda: len(released) == 6, timeout_s=10)
    times = sorted(at for _, at in released)
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    assert {name for name, _ in released} == {"a", "b"} and min(gaps) >= 0.2, (released, gaps)  # 262 ms, less a late wake-up
