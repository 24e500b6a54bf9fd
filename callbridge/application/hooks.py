"""The application, reached one of two ways: a webhook (``app.webhook_url``) or a Python module
(``app.module = "myagent:app"``), and the deadline every request to it runs under.

A Python application is an object with ``async def assistant(self, call: CallContext) -> AssistantReply |
AssistantConfig`` and, for the tools its assistants declare, ``async def tool(self, call, name, arguments) -> str |
ToolResult``; the webhook receives ``{"type": "assistant-request", "call": CallContext}`` and answers
``AssistantReply``'s JSON, and ``{"type": "tool-call", "call": …, "name": …, "arguments": {…}}`` answered with
``ToolResult``'s (each signed: ``signing.py``). A tool that fails or runs past ``app.tool_timeout_s`` answers the
model an error it can speak to, never a call left waiting. A slow or failing application never leaves a caller in
silence: past ``app.assistant_timeout_s``, or on any error or an answer that does not parse, the call gets
``app.on_failure`` (the bridge's configured assistant, or busy), logged and counted (``AssistantOutcome.failure``).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import httpx
from pydantic import ValidationError

from callbridge.application.assistant import AssistantConfig, AssistantReply, ToolResult
from callbridge.application.context import CallContext
from callbridge.application.events import CallEvent
from callbridge.application.signing import SIGNATURE_HEADER, sign
from callbridge.outbound_http import http_client

if TYPE_CHECKING:
    from callbridge.outbound.request import Calls

__all__ = [
    "MAX_REPLY_BYTES",
    "Application",
    "ApplicationFailed",
    "AssistantOutcome",
    "AssistantSource",
    "ToolOutcome",
    "ModuleApplication",
    "WebhookApplication",
    "load_module",
]

MAX_REPLY_BYTES = 256 * 1024
"""An application's answer larger than this is a failure (read no further): instructions and tools fit well within."""


class ApplicationFailed(Exception):
    """The application did not answer usably; ``reason`` (``status_500``, ``invalid``, ``too_large``…) is logged."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@runtime_checkable
class Application(Protocol):
    """What a Python application provides (the module's object) and what the webhook client stands for."""

    async def assistant(self, call: CallContext) -> AssistantReply | AssistantConfig: ...

    async def tool(self, call: CallContext, name: str, arguments: dict[str, Any]) -> ToolResult | str: ...


class ModuleApplication:
    """A Python application loaded from ``module:attribute`` (an object with the hooks, or a class to instantiate)."""

    def __init__(self, target: object) -> None:
        self.target = target

    async def assistant(self, call: CallContext) -> AssistantReply | AssistantConfig:
        hook = getattr(self.target, "assistant", None)
        if hook is None:
            return AssistantReply.answer()
        reply = await hook(call)
        if not isinstance(reply, AssistantReply | AssistantConfig):
            raise ApplicationFailed("invalid", f"assistant() returned {type(reply).__name__}")
        return reply

    async def event(self, call: CallContext, event: CallEvent) -> None:
        hook = getattr(self.target, "event", None)
        if hook is not None:
            await hook(call, event)

    async def started(self, calls: Calls) -> None:
        """The bridge has started: the application's ``started(calls)`` hook, where it has one, gets what places
        calls (``callbridge.outbound.Calls``)."""
        hook = getattr(self.target, "started", None)
        if hook is not None:
            await hook(calls)

    async def tool(self, call: CallContext, name: str, arguments: dict[str, Any]) -> ToolResult | str:
        hook = getattr(self.target, "tool", None)
        if hook is None:
            raise ApplicationFailed("no_tool_hook", "the application has no tool(call, name, arguments) hook")
        result = await hook(call, name, arguments)
        if not isinstance(result, ToolResult | str):
            raise ApplicationFailed("invalid", f"tool() returned {type(result).__name__}")
        return result


def load_module(spec: str) -> ModuleApplication:
    """``module:attribute`` imported (``ValueError`` with what is wrong: checked as the configuration loads). A
    class is instantiated with no arguments."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"app.module {spec!r}: expected 'module:attribute'")
    if os.getcwd() not in sys.path:  # as uvicorn's --app-dir: the application beside where callbridge runs
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"app.module {spec!r}: {exc}") from exc
    target = getattr(module, attribute, None)
    if target is None:
        raise ValueError(f"app.module {spec!r}: {module_name} has no {attribute}")
    if isinstance(target, type):
        target = target()
    if not callable(getattr(target, "assistant", None)):
        raise ValueError(f"app.module {spec!r}: no async assistant(call) hook")
    return ModuleApplication(target)


class WebhookApplication:
    """The application behind ``app.webhook_url``: each request a signed JSON POST on one connection pool."""

    def __init__(self, url: str, secret: str, *, client: httpx.AsyncClient | None = None) -> None:
        self.url = url
        self.secret = secret
        self.client = client or http_client(limits=httpx.Limits(max_connections=200, max_keepalive_connections=50))

    async def post(self, payload: dict[str, object], timeout_s: float) -> bytes:
        """POST ``payload`` signed; the answer's body (2xx, at most ``MAX_REPLY_BYTES``), else ``ApplicationFailed``."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(self.secret, body)}
        try:
            async with self.client.stream("POST", self.url, content=body, headers=headers, timeout=timeout_s) as response:
                if not 200 <= response.status_code < 300:
                    raise ApplicationFailed(f"status_{response.status_code}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_REPLY_BYTES:
                        raise ApplicationFailed("too_large", f"over {MAX_REPLY_BYTES} bytes")
                    chunks.append(chunk)
                return b"".join(chunks)
        except httpx.TimeoutException as exc:
            raise ApplicationFailed("timeout", type(exc).__name__) from exc
        except httpx.HTTPError as exc:
            raise ApplicationFailed("unreachable", repr(exc)) from exc

    async def assistant(self, call: CallContext) -> AssistantReply | AssistantConfig:
        body = await self.post({"type": "assistant-request", "call": call.model_dump(mode="json")}, timeout_s=30.0)
        try:
            return AssistantReply.model_validate_json(body)
        except ValidationError as exc:
            raise ApplicationFailed("invalid", str(exc.errors(include_url=False)[:3])) from exc

    async def tool(self, call: CallContext, name: str, arguments: dict[str, Any]) -> ToolResult | str:
        payload: dict[str, object] = {"type": "tool-call", "call": call.model_dump(mode="json"), "name": name, "arguments": arguments}
        body = await self.post(payload, timeout_s=60.0)
        try:
            return ToolResult.model_validate_json(body)
        except ValidationError as exc:
            raise ApplicationFailed("invalid", str(exc.errors(include_url=False)[:3])) from exc

    async def aclose(self) -> None:
        await self.client.aclose()


@dataclass(frozen=True, slots=True)
class AssistantOutcome:
    """What a call got from its ``assistant-request``: the reply it goes on with, where from, and why not the
    application's where it is not."""

    reply: AssistantReply
    source: Literal["application", "fallback", "request"]
    failure: str | None
    """``timeout``, ``status_503``, ``invalid``, ``unreachable``, ``error``…; None when the application answered."""
    elapsed_ms: int
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What the model hears back from a tool call (``result``), and why it is an error where the application failed."""

    result: ToolResult
    failure: str | None
    elapsed_ms: int
    detail: str = ""


class AssistantSource:
    """Asks the application for each call's assistant under the deadline (``app.assistant_timeout_s``), and stands
    in for it (``on_failure``: the configured assistant, or busy) when it is slow, down, or answers nonsense."""

    def __init__(
        self,
        application: Application,
        *,
        deadline_s: float,
        on_failure: Literal["fallback", "busy"],
        tool_deadline_s: float = 10.0,
    ) -> None:
        self.application = application
        self.deadline_s = deadline_s
        self.on_failure = on_failure
        self.tool_deadline_s = tool_deadline_s

    def fallback(self) -> AssistantReply:
        return AssistantReply(reject="busy") if self.on_failure == "busy" else AssistantReply.answer()

    async def request(self, call: CallContext) -> AssistantOutcome:
        started = time.monotonic()

        def elapsed_ms() -> int:
            return int((time.monotonic() - started) * 1000)

        try:
            reply = await asyncio.wait_for(self.application.assistant(call), self.deadline_s)
        except TimeoutError:
            return AssistantOutcome(self.fallback(), "fallback", "timeout", elapsed_ms())
        except ApplicationFailed as exc:
            return AssistantOutcome(self.fallback(), "fallback", exc.reason, elapsed_ms(), exc.detail)
        except ValidationError as exc:
            return AssistantOutcome(self.fallback(), "fallback", "invalid", elapsed_ms(), str(exc.errors(include_url=False)[:3]))
        except Exception as exc:  # noqa: BLE001 - the application's own bug: the call goes on with the fallback
            return AssistantOutcome(self.fallback(), "fallback", "error", elapsed_ms(), repr(exc))
        if isinstance(reply, AssistantConfig):
            reply = AssistantReply.answer(reply)
        return AssistantOutcome(reply, "application", None, elapsed_ms())

    async def run_tool(self, call: CallContext, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        """The application's answer to the model's call of its tool ``name``, under ``tool_deadline_s``; an error
        result the model can speak to where it fails, answers nonsense or runs out of time."""
        started = time.monotonic()

        def failed(failure: str, detail: str = "") -> ToolOutcome:
            said = "the tool did not answer in time" if failure == "timeout" else "the tool failed"
            return ToolOutcome(ToolResult(error=said), failure, int((time.monotonic() - started) * 1000), detail)

        try:
            result = await asyncio.wait_for(self.application.tool(call, name, arguments), self.tool_deadline_s)
        except TimeoutError:
            return failed("timeout")
        except ApplicationFailed as exc:
            return failed(exc.reason, exc.detail)
        except ValidationError as exc:
            return failed("invalid", str(exc.errors(include_url=False)[:3]))
        except Exception as exc:  # noqa: BLE001 - the application's own bug: the model hears an error, the call goes on
            return failed("error", repr(exc))
        if isinstance(result, str):
            result = ToolResult(output=result[:16_384])
        return ToolOutcome(result, None, int((time.monotonic() - started) * 1000))

    async def aclose(self) -> None:
        close = getattr(self.application, "aclose", None)
        if close is not None:
            await close()
