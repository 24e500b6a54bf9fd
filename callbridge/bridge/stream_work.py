"""The work one carrier stream's call asks for beside its audio: the agent's actions (a transfer, digits, the
application's tools) and the call's hang-up, each a task of its own while the stream runs. A result goes back to
the call as an input (``CallInput``: under the stream's lock, its outputs sent after), so the model hears it; the
media driver (``bridge/media.py``) starts the work from the call's outputs and waits for it as the stream ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from structlog.stdlib import BoundLogger

from callbridge.bridge.actions import ActionResult, ApplicationToolCall, CarrierCallAction, TransferCall
from callbridge.bridge.call import CallSession
from callbridge.bridge.call_feed import CallFeed
from callbridge.bridge.call_outputs import PendingAction
from callbridge.bridge.registry import CallRegistry, RegistryUnavailable
from callbridge.bridge.stream_services import HangUpFn
from callbridge.bridge.stream_setup import StreamSetup
from callbridge.bridge.stream_telemetry import StreamTelemetry
from callbridge.carriers.base import StreamStarted

__all__ = ["ACTION_RESULT_WAIT_S", "CallInput", "CarrierWork", "recorded"]

ACTION_RESULT_WAIT_S = 10.0
"""How long a stream that has ended waits for the carrier work the agent asked for (a transfer whose TwiML ended
the stream) to answer, so the model hears its result and the call's end says transferred; then it is cancelled."""
_HANG_UP_WAIT_S = 10.0
"""How long a stream that has ended waits for its call's hang-up request to be answered."""

PerformFn = Callable[[str, str, str | None, CarrierCallAction], Awaitable[ActionResult]]
"""``perform_action(provider, call_id, account_id, action)``: the agent's transfer or digits, by the carrier."""

CallInput = Callable[[Callable[[CallSession, int], None]], Awaitable[None]]
"""Hand the call one input (given the call and the time now), under the stream's lock; then send what it produced."""


async def recorded(write: Awaitable[None], log: BoundLogger) -> bool:
    """A registry write; False, logged, when the registry is unreachable (the call goes on without it)."""
    try:
        await write
    except RegistryUnavailable as exc:
        log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)
        return False
    return True


class CarrierWork:
    """One stream's actions and hang-up under way (see the module docstring)."""

    def __init__(
        self,
        registry: CallRegistry,
        carrier: tuple[PerformFn, HangUpFn],
        seen: StreamTelemetry,
        feed: CallFeed,
        setup: StreamSetup,
        to_call: CallInput,
    ) -> None:
        """``carrier``: how the carrier performs an action and hangs up (``BridgeServices.perform_action``,
        ``.hang_up``); ``registry``: where the call is marked ended before its hang-up."""
        self._registry, (self._perform_action, self._hang_up_by_carrier) = registry, carrier
        self._seen, self._feed, self._setup, self._to_call = seen, feed, setup, to_call
        self._actions: set[asyncio.Task[None]] = set()
        """The agent's carrier work under way: waited for, a while, when the stream ends."""
        self._hang_up: asyncio.Task[None] | None = None
        self._hung_up = False

    def perform(self, pending: PendingAction, start: StreamStarted) -> asyncio.Task[None]:
        """The agent's transfer, digits or tool call on the call ``start`` names, under way from now (the carrier or
        the application does it)."""
        action = asyncio.create_task(self._perform(pending, start))
        self._actions.add(action)
        action.add_done_callback(self._actions.discard)
        return action

    def hang_up(self, reason: str, start: StreamStarted | None) -> None:
        """The call's hang-up, the carrier's way (REST), once: the registry first says the call ended. None: the
        stream's ``start`` was never accepted, there is no call to hang up."""
        if self._hung_up:
            return
        self._hung_up = True
        if start is not None:
            self._hang_up = asyncio.create_task(self._hung_up_by_carrier(start, reason))

    async def actions_answered(self) -> None:
        """The stream has ended: the actions under way have ``ACTION_RESULT_WAIT_S`` to answer (then the stream
        cancels them with its other tasks)."""
        if self._actions:
            await asyncio.wait(self._actions, timeout=ACTION_RESULT_WAIT_S)

    async def hang_up_answered(self) -> None:
        if self._hang_up is not None:
            await asyncio.wait({self._hang_up}, timeout=_HANG_UP_WAIT_S)

    async def _perform(self, pending: PendingAction, start: StreamStarted) -> None:
        """Ask the carrier to do what the agent asked for; the result goes back to the call (and the model)."""
        if isinstance(pending.action, ApplicationToolCall):
            await self._run_tool(pending.call_id, pending.action)
            return
        action = type(pending.action).__name__
        try:
            result = await self._perform_action(self._seen.provider, start.call_id, start.account_id, pending.action)
        except Exception as exc:
            self._seen.log.warning("call_action_error", action=action, error=repr(exc))
            result = ActionResult.failed("carrier_error", type(exc).__name__)
        if isinstance(pending.action, TransferCall):
            self._feed.emit("transfer", target=pending.action.target, ok=result.ok)
        self._seen.action(action, "ok" if result.ok else result.error or "failed", result.detail)
        await self._to_call(lambda call, now_ms: call.action_finished(pending.call_id, result, now_ms))

    async def _run_tool(self, call_id: str, tool: ApplicationToolCall) -> None:
        """The application answers the model's call of its tool; past ``app.tool_filler_after_s`` the call is told
        it is slow (its filler). The answer goes to the call (and the model)."""

        async def slow() -> None:
            await self._to_call(lambda call, now_ms: call.tool_slow(call_id, now_ms))

        answer, outcome = await self._setup.run_tool(tool, slow)
        failure = outcome.failure or ("tool_error" if outcome.result.error is not None else None)
        self._feed.tool_ran(tool.name, ok=failure is None, elapsed_ms=outcome.elapsed_ms)
        self._seen.tool_ran(tool.name, failure, outcome.elapsed_ms, outcome.detail)
        await self._to_call(lambda call, now_ms: call.action_finished(call_id, answer, now_ms))

    async def _hung_up_by_carrier(self, start: StreamStarted, reason: str) -> None:
        await recorded(self._registry.mark_ended(start.call_id, reason), self._seen.log)
        try:
            await self._hang_up_by_carrier(self._seen.provider, start.call_id, start.account_id, reason)
        except Exception as exc:
            self._seen.hung_up(reason, exc)
            return
        self._seen.hung_up(reason, None)
