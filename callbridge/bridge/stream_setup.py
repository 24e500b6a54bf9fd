"""What one carrier stream asks of its call's application: the call's setup (the assistant kept where the call was
answered, or chosen now from what the stream's start says of the call, for a carrier with no answer webhook), and
the answers of the application's tools the model calls. The media driver (``bridge/media.py``) asks it; what goes
back to the application (events, report, recording) is ``bridge/call_feed.py``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from structlog.stdlib import BoundLogger

from callbridge.application import CallContext
from callbridge.application.context import allowed_parameters, e164
from callbridge.application.hooks import AssistantSource, ToolOutcome
from callbridge.bridge.actions import ActionResult, ApplicationToolCall
from callbridge.bridge.answer_desk import AnswerDesk
from callbridge.bridge.call_setup import CallSetup, Rejection, TransferTo
from callbridge.bridge.registry import RegistryUnavailable
from callbridge.carriers.base import StreamStarted
from callbridge.config import AppSettings

__all__ = ["StreamSetup"]


class StreamSetup:
    """The call's setup for one stream, read (or chosen) once, and its application's tools."""

    def __init__(self, assistants: AssistantSource | None, desk: AnswerDesk, app: AppSettings) -> None:
        """``assistants``: the application's (None: no application); ``desk``: where the call was answered, its
        setup kept; ``app``: the application's settings (tool timings, the parameters a context carries)."""
        self._assistants, self._desk, self._app = assistants, desk, app
        self.read: CallSetup | None = None
        """The call's setup as this stream read (or chose) it."""

    async def setup(self, start: StreamStarted, provider: str, log: BoundLogger, *, choose: bool) -> CallSetup | Rejection | None:
        """The call's setup (``AnswerDesk.choose_assistant``), with an application configured: the one kept
        where the call was answered; else, ``choose``, asked for now from what the stream's start says of the call
        (a carrier with no answer webhook) — or how the application refused the call. Once per stream. None: no
        application, or nothing kept and not ``choose``. Raises ``RegistryUnavailable``."""
        if not self._desk.keeps_setups:
            return None
        if self.read is None:
            self.read = await self._desk.call_setup(start.call_id)
        if self.read is None and choose and self._assistants is not None:
            chosen = await self._desk.choose_assistant(self.context(start, provider))
            if isinstance(chosen, TransferTo):  # a stream is answered already: nothing the carrier can send on
                log.warning("transfer_unsupported", target=chosen.target, detail="the configured assistant takes the call")
                return None
            if not isinstance(chosen, CallSetup):
                return chosen
            self.read = chosen
        return self.read

    async def bound_setup(self, start: StreamStarted, provider: str, log: BoundLogger) -> CallSetup | None:
        """The call's setup as its session binds (its greeting, its tools): None without an application, or where
        the registry has none (the configured assistant then)."""
        try:
            setup = await self.setup(start, provider, log, choose=False)
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)
            return None
        return setup if isinstance(setup, CallSetup) else None

    def context(self, start: StreamStarted, provider: str) -> CallContext:
        """What the stream's start says of the call (carriers with no answer webhook build the context here)."""
        return CallContext(
            call_id=start.call_id,
            carrier=provider,
            account_id=start.account_id,
            caller_number=e164(start.caller),
            called_number=e164(start.called),
            parameters=allowed_parameters(start.custom_parameters, self._app.context_parameters),
        )

    async def run_tool(self, tool: ApplicationToolCall, slow: Callable[[], Awaitable[None]]) -> tuple[ActionResult, ToolOutcome]:
        """The application answers the model's call of its tool (``AssistantSource.run_tool``, under
        ``app.tool_timeout_s``); past ``app.tool_filler_after_s`` ``slow`` is awaited (the call's filler). The
        answer for the model, and how the tool ran."""
        assistants, setup = self._assistants, self.read
        assert assistants is not None and setup is not None, "application tools come with a setup"
        running = asyncio.ensure_future(assistants.run_tool(setup.context, tool.name, dict(tool.arguments)))
        try:
            done, _ = await asyncio.wait({running}, timeout=self._app.tool_filler_after_s)
            if not done:
                await slow()
            outcome = await running
        finally:
            running.cancel()
        result = outcome.result
        answer = ActionResult.answered(result.output) if result.output is not None else ActionResult.failed("tool_failed", result.error)
        return answer, outcome
