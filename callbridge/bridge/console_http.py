"""``/console``: the operators' page and its API, over the registry's journal of calls (``registry_journal``), so every
bridge sharing the registry shows the whole fleet's calls.

    GET /console                               the page (``console.html``)
    GET /console/api/calls?live=1              the calls up now, newest first (their cards: ``console_view.call_card``)
    GET /console/api/calls?number=&carrier=&reason=&limit=&page=
                                               finished calls, newest first, searched ``SEARCHED`` at a time: page 0
                                               the newest, page 1 the next, …; ``older`` says whether more remain
    GET /console/api/live                      the calls up now as server-sent events: a ``calls`` event whenever the
                                               list changes (read every ``LIVE_EVERY_S``), a comment every 15 s
    GET /console/api/calls/{call_id}           one call: its card, its timeline, its end-of-call report
    GET /console/api/calls/{call_id}/recording its stereo WAV (left the caller, right the agent), where this process
                                               can read it (``recording.directory``)
    GET /console/api/fleet                     every bridge process as it last announced itself (``console_fleet``)

Off (404, as any unknown path) unless ``console.token`` or ``console.password`` is set. Every route then asks for
``Authorization: Bearer <token>`` or HTTP basic (``console.username`` and ``console.password``, or any user name with
the token as its password): 401 with a basic challenge without them, checked before anything is read, in constant
time. Nothing of a call (numbers, transcripts, audio) is served otherwise.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
from collections.abc import AsyncIterator, Callable
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Final

import orjson
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse

from callbridge.bridge.console_view import CallCard, call_card, call_view, matches
from callbridge.bridge.registry import CallRegistry, RegistryUnavailable
from callbridge.bridge.services import BridgeServices
from callbridge.config import ConsoleSettings
from callbridge.logging import get_logger

__all__ = ["LIVE_EVERY_S", "LIVE_LISTED", "SEARCHED", "console_on", "console_router"]

log = get_logger(__name__)

LIVE_EVERY_S: Final = 0.5
"""How often the live list is read from the registry while anyone watches it: a call shows within a second of its start."""
LIVE_LISTED: Final = 500
"""Calls up now listed at most (the newest)."""
SEARCHED: Final = 500
"""Finished calls a search looks through (the newest): each is one registry read."""
_KEEPALIVE_S: Final = 15.0
_PAGE_HEADERS: Final = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; media-src 'self' blob:; img-src 'self' data:"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}
_CHALLENGE: Final = {"WWW-Authenticate": 'Basic realm="callbridge console", charset="UTF-8"'}


def console_on(settings: ConsoleSettings) -> bool:
    """The console is served (and the journal written) once it has a credential."""
    return settings.token is not None or settings.password is not None


def _credentials(settings: ConsoleSettings) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    """What may be shown: bearer tokens, and basic (user, password) pairs (an empty user: any)."""
    bearers, basics = [], []
    if settings.token is not None:
        bearers.append(settings.token.get_secret_value().encode())
        basics.append((b"", settings.token.get_secret_value().encode()))
    if settings.password is not None:
        basics.append((settings.username.encode(), settings.password.get_secret_value().encode()))
    return bearers, basics


def _authorized(authorization: str | None, bearers: list[bytes], basics: list[tuple[bytes, bytes]]) -> bool:
    if authorization is None or len(authorization) > 1024:
        return False
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer":
        shown = value.strip().encode()
        return any(hmac.compare_digest(shown, bearer) for bearer in bearers)
    if scheme.lower() != "basic":
        return False
    try:
        user, _, password = base64.b64decode(value.strip(), validate=True).partition(b":")
    except (binascii.Error, ValueError):
        return False
    ok = False
    for want_user, want_password in basics:  # every pair compared: the time says nothing of which matched
        same_user = not want_user or hmac.compare_digest(user, want_user)
        ok |= hmac.compare_digest(password, want_password) and same_user
    return ok


class _LiveBoard:
    """The calls up now, read from the registry every ``LIVE_EVERY_S`` while anyone watches (one reader per process,
    however many watch), and handed to each watcher as it changes. Once the process is ``stopping`` (draining), every
    watch ends: an open stream would hold the server's graceful shutdown for ever (the browser's EventSource asks
    again, and the load balancer sends it to a bridge that serves)."""

    def __init__(self, registry: CallRegistry, max_viewers: int, stopping: Callable[[], bool] = lambda: False) -> None:
        self._registry, self.max_viewers, self._stopping = registry, max_viewers, stopping
        self.viewers = 0
        self._changed = asyncio.Condition()
        self.snapshot: bytes = b"[]"
        self._reader: asyncio.Task[None] | None = None

    async def watch(self) -> AsyncIterator[bytes]:
        """The list as it is, then each time it changes (JSON); a comment (``b""``) after a quiet ``_KEEPALIVE_S``."""
        self.viewers += 1
        try:
            if self._reader is None or self._reader.done():
                await self._read()
                self._reader = asyncio.get_running_loop().create_task(self._read_forever(), name="console-live")
            sent = self.snapshot
            yield sent
            while not self._stopping():
                async with self._changed:  # not held across a yield: the reader notifies every viewer under it
                    try:
                        await asyncio.wait_for(self._changed.wait_for(lambda: self.snapshot is not sent or self._stopping()), _KEEPALIVE_S)
                        changed = True
                    except TimeoutError:
                        changed = False
                if self._stopping():
                    return
                if changed:
                    sent = self.snapshot
                    yield sent
                else:
                    yield b""
        finally:
            self.viewers -= 1

    async def _read_forever(self) -> None:
        while self.viewers > 0:
            await asyncio.sleep(LIVE_EVERY_S)
            if self._stopping():
                async with self._changed:
                    self._changed.notify_all()
                return
            await self._read()

    async def _read(self) -> None:
        """The list read again; the watchers told where it changed. A registry that fails keeps the last one shown."""
        try:
            snapshot = orjson.dumps(await live_cards(self._registry))
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)
            return
        if snapshot != self.snapshot:
            async with self._changed:
                self.snapshot = snapshot
                self._changed.notify_all()


async def live_cards(registry: CallRegistry) -> list[CallCard]:
    """The calls up now across the fleet, newest first, each with the bridge process that last wrote of it
    (``bridge``); one whose bridge no longer announces itself (``console_fleet``: gone 15 s and more) is ``lost``:
    it died with the call, and nothing has taken the call on."""
    alive = {orjson.loads(status).get("process_id") for status in await registry.announced()}
    cards = []
    for call_id in await registry.journaled(True, LIVE_LISTED):
        page = await registry.journal_of(call_id)
        card = call_card(call_id, page)
        if card is None:
            continue
        card["bridge"] = page.writer
        if alive and page.writer is not None and page.writer not in alive:
            card["state"] = "lost"
        cards.append(card)
    return cards


async def finished_cards(
    registry: CallRegistry, number: str | None, carrier: str | None, reason: str | None, limit: int, page: int = 0
) -> tuple[list[CallCard], bool]:
    """The finished calls that match (``console_view.matches``), newest first, at most ``limit``, of the ``page``-th
    ``SEARCHED`` (0: the newest); and whether older finished calls remain past that page (a request reads at most
    ``SEARCHED`` journals, whatever the registry keeps: ``console.calls_kept``)."""
    found: list[CallCard] = []
    for call_id in await registry.journaled(False, SEARCHED, page * SEARCHED):
        card = call_card(call_id, await registry.journal_of(call_id))
        if card is not None and matches(card, number=number, carrier=carrier, reason=reason):
            found.append(card)
            if len(found) >= limit:
                break
    return found, bool(await registry.journaled(False, 1, (page + 1) * SEARCHED))


def console_router(services: BridgeServices) -> APIRouter:
    """The console's routes (see the module docstring); none while it has no credential."""
    settings = services.settings.console
    router = APIRouter()
    if not console_on(settings):
        return router
    bearers, basics = _credentials(settings)
    registry = services.registry
    board = _LiveBoard(registry, settings.max_viewers, lambda: services.draining)
    page = resources.files("callbridge.bridge").joinpath("console.html").read_text(encoding="utf-8")
    recordings_dir = services.settings.recording.directory

    def operator(request: Request) -> None:
        if not _authorized(request.headers.get("authorization"), bearers, basics):
            log.warning("console_unauthorized", peer=request.client.host if request.client else None, path=request.url.path)
            raise HTTPException(401, "the console's credentials (console.token, or console.username and console.password)", headers=_CHALLENGE)

    guarded = APIRouter(dependencies=[Depends(operator)])

    @guarded.get("/console")
    async def console_page() -> Response:
        return HTMLResponse(page, headers=_PAGE_HEADERS)

    @guarded.get("/console/api/calls")
    async def calls(
        live: bool = False, number: Annotated[str | None, Query(max_length=64)] = None,
        carrier: Annotated[str | None, Query(max_length=32)] = None, reason: Annotated[str | None, Query(max_length=64)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 100, page: Annotated[int, Query(ge=0, le=1000)] = 0,
    ) -> JSONResponse:  # fmt: skip
        try:
            if live:
                return JSONResponse({"calls": (await live_cards(registry))[:limit]})
            found, older = await finished_cards(registry, number, carrier, reason, limit, page)
        except RegistryUnavailable as exc:
            raise HTTPException(503, f"the registry: {exc.detail}") from None
        return JSONResponse({"calls": found, "page": page, "older": older})

    @guarded.get("/console/api/live")
    async def live() -> Response:
        if services.draining:
            return JSONResponse({"error": "draining", "detail": "this bridge is stopping: ask another"}, status_code=503)
        if board.viewers >= board.max_viewers:
            return JSONResponse({"error": "too_many_viewers", "detail": f"console.max_viewers is {board.max_viewers}"}, status_code=429)

        async def stream() -> AsyncIterator[bytes]:
            async for snapshot in board.watch():
                yield b"event: calls\ndata: " + snapshot + b"\n\n" if snapshot else b": still here\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @guarded.get("/console/api/calls/{call_id}")
    async def one_call(call_id: str) -> JSONResponse:
        card, events, report = await _view(registry, call_id)
        return JSONResponse({"call": card, "timeline": events, "report": report})

    @guarded.get("/console/api/calls/{call_id}/recording")
    async def recording(call_id: str) -> Response:
        _, _, report = await _view(registry, call_id)
        path = _recording_path(report, recordings_dir)
        if path is None:
            raise HTTPException(404, "no recording of this call that this process can read")
        return FileResponse(path, media_type="audio/wav", headers={"Cache-Control": "no-store"})

    @guarded.get("/console/api/fleet")
    async def fleet() -> JSONResponse:
        try:
            announced = await registry.announced()
        except RegistryUnavailable as exc:
            raise HTTPException(503, f"the registry: {exc.detail}") from None
        return JSONResponse({"bridges": [orjson.loads(status) for status in announced]})

    router.include_router(guarded)
    return router


async def _view(registry: CallRegistry, call_id: str) -> tuple[CallCard, list[dict[str, Any]], dict[str, Any] | None]:
    """The call's card, timeline and report (``console_view.call_view``); 404 where there is none, 503 where the
    registry fails."""
    if len(call_id) > 128:
        raise HTTPException(404, "no such call")
    try:
        page = await registry.journal_of(call_id)
    except RegistryUnavailable as exc:
        raise HTTPException(503, f"the registry: {exc.detail}") from None
    view = call_view(call_id, page)
    if view is None:
        raise HTTPException(404, "no such call, or its timeline has expired")
    return view


def _recording_path(report: dict[str, Any] | None, directory: Path) -> Path | None:
    """The call's recording as its report names it, where it is a WAV file in ``recording.directory`` (a report is
    the bridge's own, but a path is only served from there)."""
    named = report.get("recording") if report is not None else None
    if not isinstance(named, str) or not named.endswith(".wav"):
        return None
    path = Path(named).resolve()
    if path.parent != directory.resolve() or not path.is_file():
        return None
    return path
