"""Telnyx's HTTP side: Call Control webhooks (signed with ed25519), the media websocket, and the Call Control REST
commands — answer with streaming, restart streaming, reject, hang up (telephony-protocols.md §3.1, §7).

Flow of an inbound call::

    call.initiated  ──▶  POST /v2/calls/{id}/actions/answer   stream_url = wss://…/telnyx/media, rtp both ways,
                                                              the call's single-use token in custom_parameters
    media socket    ──▶  MediaStreamDriver(TelnyxCodec)        (the token is checked in ``start``)
    streaming.stopped / streaming.failed while the call is up and not over
                    ──▶  POST …/actions/streaming_start       a new token; the new stream resumes the engine session
    call.hangup     ──▶  the call is over (no restart, a late stream is refused)

The call's key is ``call_control_id``: it survives a stream restart, the
``stream_id`` does not. Any bridge process may get any webhook of a call (the
answer from one, the media socket on another, ``streaming.stopped`` on a third),
so what the webhooks keep about a call — answered, hung up, streams restarted —
are counters in the shared registry (``CallRegistry.count``), not in a process. A Telnyx call outlives its stream (the stream is a fork
of the call), so a call whose stream cannot be restarted — too many restarts,
the bridge full or draining, or the call already over for the bridge while
Telnyx has not sent ``call.hangup`` — is hung up rather than left in silence.

Webhooks are verified with the account's ed25519 public key: the signature
(``telnyx-signature-ed25519``, base64) is over ``f"{telnyx-timestamp}|{body}"``
with the raw body, and a timestamp more than 5 minutes off is refused (no
replays). A failed check is a 403 and nothing else. The media websocket has no
signature of its own: a stream is bridged only with a token an answer minted.

Call Control commands are answered 200 ``{"data":{"result":"ok"}}``; a 422
whose error code is 90018 means the call has already ended, which is done for
a hang-up.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, Final
from urllib.parse import quote

import httpx
import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fastapi import APIRouter, Request, Response, WebSocket
from pydantic import SecretStr

from callbridge.application.context import call_context
from callbridge.bridge.actions import ActionResult, CarrierCallAction, SendDtmf
from callbridge.bridge.call_setup import Chosen, TransferTo
from callbridge.bridge.carrier_plugin import Carrier
from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.dialer import Answering, DialLeg, DialProgress, DialRejected
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.media import MediaStreamDriver
from callbridge.bridge.registry import RegistryUnavailable, counters_kept_ms
from callbridge.carriers.telnyx.wire import TelnyxCodec
from callbridge.carriers.webhooks import answer_url_parameters, public_base, ws_url
from callbridge.config import Settings
from callbridge.logging import get_logger
from callbridge.outbound_http import http_client, response_object

__all__ = [
    "ALREADY_ENDED",
    "ANSWERED",
    "CARRIER",
    "EVENTS_PATH",
    "MAX_SIGNATURE_AGE_S",
    "MEDIA_PATH",
    "OVER",
    "RESTARTS",
    "TelnyxCalls",
    "TelnyxRest",
    "TelnyxSignatures",
    "dial_of",
    "dial_state",
    "placed_call_progress",
    "stream_parameters",
    "telnyx_router",
]

log = get_logger(__name__)

EVENTS_PATH: Final = "/telnyx/events"
MEDIA_PATH: Final = "/telnyx/media"
SIGNATURE_HEADER: Final = "telnyx-signature-ed25519"
TIMESTAMP_HEADER: Final = "telnyx-timestamp"
MAX_SIGNATURE_AGE_S: Final = 300
ALREADY_ENDED: Final = "90018"
"""Call Control error code: "Call has already ended"."""
MAX_STREAM_RESTARTS: Final = 5
"""Streams restarted for one call before it is hung up instead (a stream that fails at once would loop)."""
ANSWERED: Final = "telnyx_answered"
"""Counter: answers begun for the call (above 1: a retried ``call.initiated``, already being answered)."""
OVER: Final = "telnyx_over"
"""Counter: above 0 once the call needs nothing more from us (``call.hangup`` came, or we hung up or rejected)."""
RESTARTS: Final = "telnyx_restarts"
"""Counter: streams restarted for the call."""

_FORBIDDEN: Final = 403
_DIAL_STATE: Final = "callbridge-dial:"
_HANGUP_PROGRESS: Final[dict[str, DialProgress]] = {
    "normal_clearing": "completed", "user_busy": "busy", "timeout": "no_answer", "no_answer": "no_answer",
    "call_rejected": "declined", "originator_cancel": "canceled",
}  # fmt: skip


class TelnyxSignatures:
    """ed25519 webhook signatures: over ``timestamp|body``, at most ``MAX_SIGNATURE_AGE_S`` off the clock."""

    def __init__(self, public_key: str | None, *, enabled: bool = True, clock: Callable[[], float] = time.time) -> None:
        self.enabled = enabled
        self._clock = clock
        self._key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key, validate=True)) if public_key else None

    def valid(self, body: bytes, signature: str | None, timestamp: str | None) -> bool:
        if not self.enabled:
            return True
        if self._key is None or not signature or not timestamp:
            return False
        try:
            sent_at = int(timestamp)
            raw = base64.b64decode(signature, validate=True)
        except (ValueError, binascii.Error):
            return False
        if abs(self._clock() - sent_at) > MAX_SIGNATURE_AGE_S:
            return False
        try:
            self._key.verify(raw, timestamp.encode("ascii") + b"|" + body)
        except InvalidSignature:
            return False
        return True


def stream_parameters(stream_url: str, token: str, codec: str) -> dict[str, Any]:
    """What starts our stream, on ``answer`` and ``streaming_start``: the caller's audio, rtp both ways in one codec
    (the bridge sends back what ``start`` announces), and the token."""
    return {
        "stream_url": stream_url,
        "stream_track": "inbound_track",
        "stream_codec": codec,
        "stream_bidirectional_mode": "rtp",
        "stream_bidirectional_codec": codec,
        "custom_parameters": [{"name": "token", "value": token}],
    }


class TelnyxRest:
    """The Call Control commands the bridge sends (Bearer API key). Each raises ``httpx.HTTPError`` on failure; a
    call the agent places is ``dial``, which raises ``DialRejected``."""

    def __init__(
        self, base_url: str, api_key: SecretStr | None, *, client: httpx.AsyncClient | None = None, connection_id: str | None = None
    ) -> None:
        self._base = base_url.rstrip("/")
        self._key = api_key.get_secret_value() if api_key else None
        self._client = client or http_client(timeout=10.0)
        self._connection_id = connection_id

    @property
    def can_dial(self) -> bool:
        return self._key is not None and self._connection_id is not None

    async def dial(self, leg: DialLeg) -> str:
        """``POST /v2/calls`` on the connection: Telnyx rings ``leg.to`` for the ring timeout (``timeout_secs``) and
        sends the call's webhooks (``call.initiated``, ``call.answered``, ``call.hangup``) to our events URL, each
        with the ``client_state`` that names the dial. Its ``call_control_id``; raises ``DialRejected``."""
        if not self.can_dial:
            raise DialRejected("not_configured", "dialling needs telnyx.api_key and telnyx.connection_id")
        body = {
            "connection_id": self._connection_id, "to": leg.to, "from": leg.from_, "timeout_secs": leg.ring_timeout_s,
            "webhook_url": f"{leg.base_url}{EVENTS_PATH}", "webhook_url_method": "POST", "client_state": dial_state(leg.dial_id),
        }  # fmt: skip
        try:
            response = await self._client.post(
                f"{self._base}/v2/calls", content=orjson.dumps(body),
                headers={"Authorization": f"Bearer {self._key}", "Content-Type": "application/json", "Accept": "application/json"},
            )  # fmt: skip
        except httpx.HTTPError as exc:
            raise DialRejected("unreachable", repr(exc)) from exc
        answer = response_object(response)
        data = answer.get("data")
        call_id = data.get("call_control_id") if isinstance(data, dict) else None
        if response.status_code >= 300 or not isinstance(call_id, str) or not call_id:
            errors = answer.get("errors")
            first = errors[0] if isinstance(errors, list) and errors and isinstance(errors[0], dict) else {}
            raise DialRejected("refused", f"HTTP {response.status_code} {first.get('code', '')} {first.get('detail') or first.get('title') or response.text[:200]}".strip())
        return call_id

    async def prepare(self) -> None:
        """Nothing to get ready: every dial is one request with the credentials as they are."""

    async def cancel(self, call_id: str) -> bool:
        """Hang up a call the agent placed while it rings (Telnyx reports ``originator_cancel``); False where it had
        ended already or the command failed."""
        try:
            return await self.command(call_id, "hangup")
        except (httpx.HTTPError, RuntimeError):
            return False

    async def command(self, call_id: str, action: str, body: dict[str, Any] | None = None) -> bool:
        """``POST /v2/calls/{call_id}/actions/{action}``: True when done, False when the call had already ended."""
        if not self._key:
            raise RuntimeError("Telnyx Call Control needs telnyx.api_key")
        response = await self._client.post(
            f"{self._base}/v2/calls/{quote(call_id, safe=':')}/actions/{action}",
            content=orjson.dumps({**(body or {}), "command_id": str(uuid.uuid4())}),
            headers={"Authorization": f"Bearer {self._key}", "Content-Type": "application/json", "Accept": "application/json"},
        )
        if response.status_code == 422 and ALREADY_ENDED in _error_codes(response):
            return False
        response.raise_for_status()
        return True

    async def answer(self, call_id: str, stream_url: str, token: str, codec: str) -> bool:
        return await self.command(call_id, "answer", stream_parameters(stream_url, token, codec))

    async def start_streaming(self, call_id: str, stream_url: str, token: str, codec: str) -> bool:
        return await self.command(call_id, "streaming_start", stream_parameters(stream_url, token, codec))

    async def reject(self, call_id: str, cause: str = "USER_BUSY") -> bool:
        return await self.command(call_id, "reject", {"cause": cause})

    async def hang_up(self, call_id: str, account_id: str | None) -> None:
        """End the call; one that has already ended (422, code 90018) counts as done."""
        await self.command(call_id, "hangup")

    async def aclose(self) -> None:
        await self._client.aclose()


def dial_state(dial_id: str) -> str:
    """The ``client_state`` of a call the agent places (Telnyx echoes it in every webhook of the call)."""
    return base64.b64encode(f"{_DIAL_STATE}{dial_id}".encode()).decode()


def dial_of(client_state: object) -> str | None:
    """The dial id a webhook's ``client_state`` names, or None (not a call placed here, or not readable)."""
    if not isinstance(client_state, str) or len(client_state) > 256:
        return None
    try:
        text = base64.b64decode(client_state, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return text.removeprefix(_DIAL_STATE) if text.startswith(_DIAL_STATE) else None


def placed_call_progress(cause: str) -> DialProgress:
    """A placed call's ``call.hangup`` cause, as the dialer follows it."""
    return _HANGUP_PROGRESS.get(cause, "failed")


def _error_codes(response: httpx.Response) -> set[str]:
    try:
        errors = response.json().get("errors", [])
    except (ValueError, AttributeError):
        return set()
    return {str(error.get("code")) for error in errors if isinstance(error, dict)} if isinstance(errors, list) else set()


class TelnyxCalls:
    """Call Control for one bridge process: answers calls, restarts their streams, hangs up what cannot go on.

    A call is ours while its ``ANSWERED`` counter is above 0 and its ``OVER`` counter is 0; the counters live in
    the registry, kept for the longest call, so that every process reads the same (``MAX_STREAM_RESTARTS`` holds
    across processes too: the restart count is one atomic increment).
    """

    def __init__(self, services: CarrierServices, rest: TelnyxRest | None = None) -> None:
        config = services.settings.telnyx
        self.services = services
        self.codec = config.codec
        self.rest = rest or TelnyxRest(config.api_base_url, config.api_key)
        server = services.settings.server
        self.kept_ms = counters_kept_ms(server.max_call_duration_s)
        """How long a call's counters are kept after their last change: past the longest call."""

    async def _count(self, call_id: str, counter: str, by: int = 1) -> int:
        return await self.services.registry.count(call_id, counter, self.kept_ms, by)

    async def answered(self, call_id: str) -> bool:
        """Whether the call was answered by the bridge (any of its processes) and still needs it."""
        counts = await self.services.registry.counts(call_id)
        return counts.get(ANSWERED, 0) > 0 and counts.get(OVER, 0) == 0

    async def on_event(self, event_type: str, payload: dict[str, Any], base: str, url_parameters: Sequence[tuple[str, str]] = ()) -> None:
        """One verified webhook (``base``: our public https URL; ``url_parameters``: the webhook URL's query, as a
        user set it on the connection: for the call's context)."""
        call_id = payload.get("call_control_id")
        if not isinstance(call_id, str) or not call_id:
            log.info("telnyx_event_ignored", event_type=event_type, reason="no call_control_id")
            return
        if event_type == "call.initiated":
            await self._initiated(call_id, payload, base, url_parameters)
        elif event_type == "call.answered" and payload.get("direction") == "outgoing":
            await self._placed_answered(call_id, payload, base)
        elif event_type in ("streaming.stopped", "streaming.failed"):
            self.services.metrics.stream_status.labels("telnyx", event_type).inc()
            await self._stream_ended(call_id, event_type, payload, base)
        elif event_type == "streaming.started":
            self.services.metrics.stream_status.labels("telnyx", event_type).inc()
            log.info("stream_status", provider="telnyx", call_id=call_id, stream_id=payload.get("stream_id"), stream_event=event_type)
        elif event_type == "call.hangup":
            if self.services.dialer is not None and dial_of(payload.get("client_state")) is not None:  # a call we placed
                cause = str(payload.get("hangup_cause", "unknown"))
                self.services.dialer.progress("telnyx", call_id, placed_call_progress(cause), cause)
            await self._count(call_id, OVER)
            # a live stream (no ``stop`` on its socket yet) ends as on a stop; a later stream or restart is refused
            await self.services.call_ended_by_carrier(call_id, EndCause(EndReason.CALLER_HUNG_UP, str(payload.get("hangup_cause", "unknown"))))
            log.info("call_hangup_event", provider="telnyx", call_id=call_id, cause=payload.get("hangup_cause"), source=payload.get("hangup_source"))

    async def _placed_answered(self, call_id: str, payload: dict[str, Any], base: str) -> None:
        """A call the agent placed was answered: its stream starts (``streaming_start``), as an inbound call's
        answer would start it, once it is admitted and its assistant chosen; else it is hung up."""
        dialer = self.services.dialer
        dial_id = dial_of(payload.get("client_state"))
        placed = await dialer.answering(dial_id, "telnyx", call_id) if dialer is not None and dial_id is not None else None
        if placed is None:
            log.info("telnyx_event_ignored", event_type="call.answered", call_id=call_id, reason="not a call placed here")
            return
        await self._initiated(call_id, payload, base, (), placed)

    async def _initiated(
        self, call_id: str, payload: dict[str, Any], base: str, url_parameters: Sequence[tuple[str, str]], placed: Answering | None = None
    ) -> None:
        """An inbound call's ``call.initiated`` (answered with our stream), or a placed call's ``call.answered``
        (``placed``: its stream started); refused, it is rejected — or, placed and answered already, hung up."""
        services = self.services
        if placed is None and payload.get("direction", "incoming") != "incoming":
            return  # a call we did not get: nothing to answer
        try:
            if await services.registry.ended_reason(call_id) is not None:
                return  # a call already over
            if await self._count(call_id, ANSWERED) > 1:
                return  # a webhook delivered again (Telnyx retries until it gets a 2xx), to this process or another
        except RegistryUnavailable as exc:  # the call cannot be recorded: busy, as every carrier's answer is then
            await self._refuse_busy(call_id, exc)
            return
        settled = False
        try:
            refusal = await services.desk.stream_refusal(call_id)
            admitted = refusal is None
            chosen = await self._assistant(call_id, payload, url_parameters, placed) if admitted else None
            if isinstance(chosen, TransferTo):  # sent on: Telnyx dials the target (UNSURE: on a parked call unanswered)
                services.desk.not_answered_by_application(call_id, "telnyx", chosen)
                await self.rest.command(call_id, "transfer", {"to": chosen.target})
                settled = True
                await self._count(call_id, OVER)
                return
            if isinstance(chosen, str):  # the application refused the call
                services.desk.not_answered_by_application(call_id, "telnyx", chosen)
                await self._refuse(call_id, "USER_BUSY" if chosen == "busy" else "CALL_REJECTED", placed)
                settled = True
                await self._count(call_id, OVER)
                return
            if not admitted or not await services.desk.engine_takes(call_id, chosen.assistant if chosen is not None else None):
                reason = refusal or "engine_capacity"
                log.warning("call_refused", call_id=call_id, provider="telnyx", reason=reason)
                services.desk.give_back_admission(call_id)  # refused after all: its slot goes back
                await self._refuse(call_id, "USER_BUSY", placed)
                settled = True
                await self._count(call_id, OVER)
                return
            token = await services.tokens.mint(call_id)
            if placed is not None:
                answered = await self.rest.start_streaming(call_id, ws_url(base) + MEDIA_PATH, token, self.codec)
            else:
                answered = await self.rest.answer(call_id, ws_url(base) + MEDIA_PATH, token, self.codec)
            settled = True
            if answered:
                log.info("call_answered", call_id=call_id, provider="telnyx", caller=payload.get("from"))
            else:
                await self._count(call_id, OVER)
        except RegistryUnavailable as exc:
            settled = True
            await self._refuse_busy(call_id, exc)
        except (httpx.HTTPError, RuntimeError) as exc:
            log.warning("call_control_failed", provider="telnyx", call_id=call_id, command="answer", error=repr(exc))
        finally:
            if not settled:  # neither answered nor rejected (Call Control failed): Telnyx's retry answers
                with suppress(RegistryUnavailable):
                    await self._count(call_id, ANSWERED, -1)

    async def _refuse(self, call_id: str, cause: str, placed: Answering | None) -> None:
        """An inbound call not taken is rejected; a placed one, answered already, is hung up."""
        if placed is None:
            await self.rest.reject(call_id, cause)
        else:
            await self.rest.hang_up(call_id, None)

    async def _assistant(
        self, call_id: str, payload: dict[str, Any], url_parameters: Sequence[tuple[str, str]], placed: Answering | None = None
    ) -> Chosen | None:
        """With an application (or a placed call's own assistant or machine detection), the call's assistant chosen
        from ``call.initiated`` (or how the application refused the call); None without one. SIP headers come as
        ``custom_headers`` (name and value), ``client_state`` base64; the webhook URL's query parameters before
        them. A placed call's context carries its dial id and metadata."""
        services = self.services
        if services.assistants is None and placed is None:
            return None
        parameters = [*url_parameters, *_custom_headers(payload.get("custom_headers"))]
        if isinstance(state := payload.get("client_state"), str):
            parameters.append(("client_state", state))
        context = call_context(
            call_id=call_id, carrier="telnyx", caller=payload.get("from"), called=payload.get("to"),
            caller_name=payload.get("caller_id_name"), carrier_call_id=payload.get("call_session_id"),
            account_id=payload.get("connection_id"), parameters=parameters, allowed=services.settings.app.context_parameters,
        )  # fmt: skip
        if placed is not None:
            return await services.desk.choose_for_placed(placed, context)
        return await services.desk.choose_assistant(context)

    async def _refuse_busy(self, call_id: str, exc: RegistryUnavailable) -> None:
        """The registry does not answer: the call is rejected busy (logged, no traceback), not left to a 500."""
        log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, call_id=call_id)
        log.warning("call_refused", call_id=call_id, provider="telnyx", reason="registry_unavailable")
        self.services.desk.give_back_admission(call_id)
        try:
            await self.rest.reject(call_id)
        except (httpx.HTTPError, RuntimeError) as error:
            log.warning("call_control_failed", provider="telnyx", call_id=call_id, command="reject", error=repr(error))

    async def _stream_ended(self, call_id: str, event_type: str, payload: dict[str, Any], base: str) -> None:
        services = self.services
        ended = await services.registry.ended_reason(call_id)
        log_fn = log.warning if event_type == "streaming.failed" else log.info
        log_fn("stream_status", provider="telnyx", call_id=call_id, stream_id=payload.get("stream_id"), stream_event=event_type, ended=ended, reason=payload.get("failure_reason"))
        if not await self.answered(call_id):
            return  # not a call we answered, or one that needs nothing more
        try:
            if ended is not None:
                # over for the bridge (hung up, refused, or its stream said stop) but no call.hangup yet: a Telnyx
                # call outlives its stream, so make sure it does not sit in silence (an ended call answers 90018)
                await self._count(call_id, OVER)
                await self.rest.hang_up(call_id, None)
                return
            restarts = await self._count(call_id, RESTARTS)
            # draining, a call another process can resume still gets its new stream: it goes to the public URL
            decision = await services.desk.restart(call_id, restarts, MAX_STREAM_RESTARTS)
            if (reason := decision.hang_up_reason) is not None:
                await services.registry.mark_ended(call_id, reason)
                await self._count(call_id, OVER)
                await self.rest.hang_up(call_id, None)
                log.warning("call_hung_up", provider="telnyx", call_id=call_id, reason=reason)
                return
            token = await services.tokens.mint(call_id)
            if await self.rest.start_streaming(call_id, ws_url(base) + MEDIA_PATH, token, self.codec):
                log.info("stream_restarted", provider="telnyx", call_id=call_id, restarts=restarts)
            else:
                await self._count(call_id, OVER)
                await services.registry.mark_ended(call_id, "call_already_ended")
        except (httpx.HTTPError, RuntimeError) as exc:
            log.warning("call_control_failed", provider="telnyx", call_id=call_id, command="streaming_start/hangup", error=repr(exc))

    async def perform(self, call_id: str, account_id: str | None, action: CarrierCallAction) -> ActionResult:
        """The agent's actions by Call Control: ``send_dtmf`` (on the call, beside our stream), ``transfer``
        (Telnyx dials the target and bridges the caller to it). A transferred call is over for the bridge first
        (counted ``OVER``), so the end of its stream is not taken for a stream to restart or a call to hang up."""
        if isinstance(action, SendDtmf):
            sent = await self.rest.command(call_id, "send_dtmf", {"digits": action.digits, "duration_millis": 250})
            return ActionResult.done() if sent else ActionResult.failed("call_ended")
        await self._count(call_id, OVER)
        try:
            transferred = await self.rest.command(call_id, "transfer", {"to": action.target})
        except Exception:
            await self._count(call_id, OVER, -1)  # the call is still ours
            raise
        return ActionResult.done(call_left=True) if transferred else ActionResult.failed("call_ended")

    async def aclose(self) -> None:
        await self.rest.aclose()


def _calls_for(services: CarrierServices) -> TelnyxCalls:
    """The process's ``TelnyxCalls`` (the router makes it, the app's lifespan closes it)."""
    calls = services.carrier_state.get("telnyx")
    if not isinstance(calls, TelnyxCalls):
        calls = services.carrier_state["telnyx"] = TelnyxCalls(services)
        services.action_performers["telnyx"] = calls
    return calls


@asynccontextmanager
async def _lifetime(services: CarrierServices) -> AsyncIterator[None]:
    """Entered for the app's life: closes the Call Control client at shutdown."""
    try:
        yield
    finally:
        calls = services.carrier_state.pop("telnyx", None)
        if isinstance(calls, TelnyxCalls):
            await calls.aclose()


def telnyx_router(services: CarrierServices) -> APIRouter:
    """The Call Control webhook and the media websocket."""
    settings = services.settings
    config = settings.telnyx
    signatures = TelnyxSignatures(config.public_key, enabled=config.validate_signatures)
    if signatures.enabled and config.public_key is None:
        log.info("carrier_not_configured", provider="telnyx", detail="no telnyx.public_key: every telnyx webhook gets 403")
    calls = _calls_for(services)
    router = APIRouter()

    @router.post(EVENTS_PATH)
    async def events(request: Request) -> Response:
        body = await request.body()
        timestamp = request.headers.get(TIMESTAMP_HEADER)
        if not signatures.valid(body, request.headers.get(SIGNATURE_HEADER), timestamp):
            log.warning("signature_invalid", provider="telnyx", path=EVENTS_PATH)
            return Response(status_code=_FORBIDDEN)
        if signatures.enabled:  # what was signed, once: its timestamp is good for MAX_SIGNATURE_AGE_S either side
            proof = f"{timestamp}|{hashlib.sha256(body).hexdigest()}"
            if not await services.replays.first_sight(request, "telnyx", proof, 2 * MAX_SIGNATURE_AGE_S):
                return Response(status_code=_FORBIDDEN)
        try:
            data = orjson.loads(body)["data"]
            event_type, payload = data["event_type"], data.get("payload") or {}
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return Response("not a Telnyx webhook", status_code=400)
        if not isinstance(event_type, str) or not isinstance(payload, dict):
            return Response("not a Telnyx webhook", status_code=400)
        await calls.on_event(event_type, payload, public_base(settings, str(request.base_url)), answer_url_parameters(request))
        return Response(status_code=200)

    @router.websocket(MEDIA_PATH)
    async def media(websocket: WebSocket) -> None:
        await websocket.accept()
        await MediaStreamDriver(websocket, TelnyxCodec(), services).run()

    return router


def telnyx_rest(settings: Settings) -> TelnyxRest:
    return TelnyxRest(settings.telnyx.api_base_url, settings.telnyx.api_key, connection_id=settings.telnyx.connection_id)


CARRIER: Final = Carrier(name="telnyx", router=telnyx_router, rest=telnyx_rest, listener=_lifetime)


def _custom_headers(headers: object) -> list[tuple[str, str]]:
    """The SIP headers Telnyx passes on (``custom_headers``: a list of name and value), those with text in both."""
    if not isinstance(headers, list):
        return []
    return [(h["name"], h["value"]) for h in headers if isinstance(h, dict) and isinstance(h.get("name"), str) and isinstance(h.get("value"), str)]
