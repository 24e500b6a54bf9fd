"""Bandwidth's HTTP side: the answer webhook (BXML), the media websocket, the call's status, stream-event and DTMF
webhooks, callback credentials, and the Voice API (OAuth 2.0) that hangs a call up and restarts its stream
(``docs/carriers/bandwidth.md``).

    initiate / redirect   ──▶  BXML: <StartGather> (digits by webhook), <StartStream mode="bidirectional"> to
                               /bandwidth/media with the call's single-use token as a <StreamParam>, then a
                               <Pause> as long as the longest call (the stream runs beside the BXML, which
                               must not end)
    mediaStreamStopped    ──▶  the call is not over: POST …/calls/{id} {redirectUrl: /bandwidth/answer}; the
                               redirect answers a new stream, which resumes the engine session (at most
                               ``MAX_STREAM_RESTARTS``, else the call is hung up, not left silent)
    dtmf                  ──▶  the digit reaches the call's stream, whichever process holds it
    disconnect            ──▶  the call is over (its stream ends as on a stop; a late stream is refused)

Every webhook must carry the application's callback credentials (``Authorization: Basic``); the BXML gives the
same credentials to the URLs it names, which Bandwidth requires to be https. Bandwidth signs nothing: a webhook
replayed with the credentials is taken again (no replay check is possible). The media upgrade carries no
credentials of its own: a stream is bridged only with the token an answer minted for its call.
"""

from __future__ import annotations

import time
from typing import Any, Final
from urllib.parse import quote
from xml.sax.saxutils import escape, quoteattr

import httpx
import orjson
from fastapi import APIRouter, Request, Response, WebSocket

from callbridge.application.context import call_context
from callbridge.bridge.answer_policy import AnswerKind
from callbridge.bridge.carrier_plugin import Carrier
from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.dialer import DialLeg, DialProgress, DialRejected
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.media import MediaStreamDriver
from callbridge.bridge.registry import RegistryUnavailable, counters_kept_ms
from callbridge.carriers.bandwidth.settings import BandwidthSettings
from callbridge.carriers.bandwidth.wire import TOKEN_PARAM, BandwidthCodec
from callbridge.carriers.webhooks import (
    DRAIN_RETRY_PAUSE_S,
    BasicCredentials,
    answer_url_parameters,
    public_base,
    ws_url,
)
from callbridge.config import Settings
from callbridge.logging import get_logger
from callbridge.outbound_http import http_client, response_object

__all__ = [
    "ANSWER_PATH",
    "CARRIER",
    "DTMF_PATH",
    "MAX_STREAM_RESTARTS",
    "MEDIA_PATH",
    "STATUS_PATH",
    "STREAM_EVENTS_PATH",
    "BandwidthRest",
    "bandwidth_router",
    "stream_bxml",
]

log = get_logger(__name__)

ANSWER_PATH: Final = "/bandwidth/answer"
MEDIA_PATH: Final = "/bandwidth/media"
STATUS_PATH: Final = "/bandwidth/status"
"""The application's disconnect (and other call status) callback."""
STREAM_EVENTS_PATH: Final = "/bandwidth/stream-events"
DTMF_PATH: Final = "/bandwidth/dtmf"
MAX_STREAM_RESTARTS: Final = 5
"""Streams restarted for one call before it is hung up instead (a stream that fails at once would loop)."""
RESTARTS: Final = "bandwidth_restarts"
"""Registry counter: streams restarted for the call."""
MAX_PAUSE_S: Final = 86_400.0
"""The longest ``<Pause>`` Bandwidth takes (0.1 to 86400 s)."""
TOKEN_EARLY_S: Final = 60.0
"""A bearer token is renewed this long before Bandwidth says it expires."""

_FORBIDDEN = 403
_DISCONNECT_PROGRESS: Final[dict[str, DialProgress]] = {
    "hangup": "completed", "busy": "busy", "timeout": "no_answer", "cancel": "canceled", "rejected": "declined",
}  # fmt: skip
"""A ``disconnect``'s cause, as the dialer follows a placed call (any other cause — ``error``, ``callback-error``,
``account-limit`` … — is ``failed``; the dialer takes a failure only of a call not answered)."""
_HANGUP: Final = '<?xml version="1.0" encoding="UTF-8"?><Response><Hangup/></Response>'


# ------------------------------------------------------------------------ BXML


def _credentials(config: BandwidthSettings) -> str:
    """``username``/``password`` attributes for the URLs a BXML names, so that their callbacks authenticate."""
    if config.callback_username is None or config.callback_password is None:
        return ""
    return f" username={quoteattr(config.callback_username)} password={quoteattr(config.callback_password.get_secret_value())}"


def transfer_bxml(target: str) -> str:
    """The call sent on: ``<Transfer>`` to the number (``<PhoneNumber>``) or the SIP URI (``<SipUri>``)."""
    noun = f"<SipUri>{escape(target)}</SipUri>" if target.startswith(("sip:", "sips:")) else f"<PhoneNumber>{escape(target)}</PhoneNumber>"
    return f'<?xml version="1.0" encoding="UTF-8"?><Response><Transfer>{noun}</Transfer></Response>'


def stream_bxml(base: str, token: str, config: BandwidthSettings, max_call_s: float) -> str:
    """The answer: digits by webhook, a bidirectional stream carrying the call's token, then a pause the length of
    the longest call (``<StartStream>`` does not block: BXML that ends ends the call). Each stream of a call needs
    its own name: the token's first characters."""
    auth = _credentials(config)
    pause_s = min(MAX_PAUSE_S, max(1.0, max_call_s or MAX_PAUSE_S))
    return (
        '<?xml version="1.0" encoding="UTF-8"?><Response>'
        f'<StartGather dtmfUrl={quoteattr(base + DTMF_PATH)} dtmfMethod="POST"{auth}/>'
        f'<StartStream name={quoteattr("callbridge-" + token[:12])} mode="bidirectional" tracks="inbound"'
        f" destination={quoteattr(ws_url(base) + MEDIA_PATH)}"
        f' streamEventUrl={quoteattr(base + STREAM_EVENTS_PATH)} streamEventMethod="POST"{auth}>'
        f"<StreamParam name={quoteattr(TOKEN_PARAM)} value={quoteattr(token)}/>"
        "</StartStream>"
        f'<Pause duration="{pause_s:g}"/>'
        "</Response>"
    )


def retry_bxml(base: str, config: BandwidthSettings) -> str:
    """A draining process's answer to a known call's redirect: a pause, then a redirect to the public answer URL,
    which the load balancer sends to a ready process."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?><Response>'
        f'<Pause duration="{DRAIN_RETRY_PAUSE_S}"/>'
        f'<Redirect redirectUrl={quoteattr(base + ANSWER_PATH)} redirectMethod="POST"{_credentials(config)}/>'
        "</Response>"
    )


async def _event(request: Request) -> dict[str, Any]:
    """The webhook's JSON object; an empty one when the body is not a JSON object (its handler answers 400 for the
    ``callId`` it lacks)."""
    try:
        payload = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return {}
    return payload if isinstance(payload, dict) else {}


# --------------------------------------------------------------------- router


class _BandwidthWebhooks:
    """Bandwidth's webhooks and media socket, a method a route (``bandwidth_router`` mounts them)."""

    def __init__(self, services: CarrierServices) -> None:
        self.services, self.settings = services, services.settings
        self.config = config = self.settings.bandwidth
        self.callbacks = BasicCredentials(config.callback_username, config.callback_password)
        if config.validate_credentials and not self.callbacks.configured:
            log.info("carrier_not_configured", provider="bandwidth", detail="no bandwidth.callback_username/password: every bandwidth webhook gets 403")
        rest = services.carrier_rests.get("bandwidth")
        # an app without the carrier's REST client (a test's): a fresh one
        self.rest = rest if isinstance(rest, BandwidthRest) else BandwidthRest(config)
        self.kept_ms = counters_kept_ms(self.settings.server.max_call_duration_s)

    async def _checked(self, request: Request, path: str) -> dict[str, Any] | None:
        """The webhook's event, when its credentials hold; else None (answered 403)."""
        if self.config.validate_credentials and not self.callbacks.valid(request.headers.get("authorization")):
            log.warning("credentials_invalid", provider="bandwidth", path=path)
            return None
        return await _event(request)

    async def answer(self, request: Request) -> Response:
        event = await self._checked(request, ANSWER_PATH)
        if event is None:
            return Response(status_code=_FORBIDDEN)
        call_id = event.get("callId")
        if not isinstance(call_id, str) or not call_id:
            return Response("callId missing", status_code=400)
        base = public_base(self.settings, str(request.base_url))
        diversion = event.get("diversion")
        context = call_context(
            call_id=call_id, carrier="bandwidth", caller=event.get("from"), called=event.get("to"),
            forwarded_from=diversion.get("origTo") if isinstance(diversion, dict) else None,
            account_id=event.get("accountId"), outbound=event.get("direction") == "outbound",
            parameters=[*answer_url_parameters(request), *((key, value) for key, value in event.items() if isinstance(value, str))],
            allowed=self.settings.app.context_parameters,
        )  # fmt: skip
        decision = await self.services.desk.decide_answer(call_id, "bandwidth", context=context, dial_id=request.query_params.get("dial"))
        match decision.kind:
            case AnswerKind.HANG_UP | AnswerKind.BUSY:
                bxml = _HANGUP
            case AnswerKind.TRANSFER:
                assert decision.target is not None
                bxml = transfer_bxml(decision.target)
            case AnswerKind.RETRY_ELSEWHERE:
                bxml = retry_bxml(base, self.config)
            case AnswerKind.ANSWER:
                assert decision.token is not None
                log.info("call_answered", call_id=call_id, provider="bandwidth", event_type=event.get("eventType"))
                bxml = stream_bxml(base, decision.token, self.config, self.settings.server.max_call_duration_s)
        return Response(bxml, media_type="application/xml")

    async def media(self, websocket: WebSocket) -> None:
        await websocket.accept()
        await MediaStreamDriver(websocket, BandwidthCodec(pcm_out_rate_hz=self.config.pcm_out_rate_hz), self.services).run()

    async def status(self, request: Request) -> Response:
        event = await self._checked(request, STATUS_PATH)
        if event is None:
            return Response(status_code=_FORBIDDEN)
        call_id = event.get("callId")
        if event.get("eventType") == "disconnect" and isinstance(call_id, str) and call_id:
            cause = str(event.get("cause", "unknown"))
            log.info("call_hangup_event", provider="bandwidth", call_id=call_id, cause=cause)
            if self.services.dialer is not None and event.get("direction") == "outbound":  # a placed call's: how it went
                detail = f"{cause}: {event.get('errorMessage')}" if event.get("errorMessage") else cause
                self.services.dialer.progress("bandwidth", call_id, _DISCONNECT_PROGRESS.get(cause, "failed"), detail[:300])
            await self.services.call_ended_by_carrier(call_id, EndCause(EndReason.CALLER_HUNG_UP, str(event.get("cause", "unknown"))))
        return Response(status_code=204)

    async def dtmf(self, request: Request) -> Response:
        event = await self._checked(request, DTMF_PATH)
        if event is None:
            return Response(status_code=_FORBIDDEN)
        call_id, digit = event.get("callId"), event.get("digit")
        if not isinstance(call_id, str) or not isinstance(digit, str) or len(digit) != 1 or digit not in "0123456789*#ABCD":
            return Response("callId and one digit needed", status_code=400)
        await self.services.digit_from_carrier(call_id, digit)
        return Response(status_code=204)

    async def stream_events(self, request: Request) -> Response:
        event = await self._checked(request, STREAM_EVENTS_PATH)
        if event is None:
            return Response(status_code=_FORBIDDEN)
        call_id, event_type = event.get("callId"), event.get("eventType")
        if not isinstance(call_id, str) or not call_id or not isinstance(event_type, str):
            return Response(status_code=204)
        label = event_type if event_type in ("mediaStreamStarted", "mediaStreamStopped", "mediaStreamRejected") else "other"
        self.services.metrics.stream_status.labels("bandwidth", label).inc()
        if label in ("mediaStreamStopped", "mediaStreamRejected"):
            await self._stream_ended(call_id, label, event, public_base(self.settings, str(request.base_url)))
        else:
            log.info("stream_status", provider="bandwidth", call_id=call_id, stream_event=event_type)
        return Response(status_code=204)

    async def _stream_ended(self, call_id: str, event_type: str, event: dict[str, Any], base: str) -> None:
        """A stream of a call stopped: where the call is not over, it gets a new one (a redirect to the answer
        URL), at most ``MAX_STREAM_RESTARTS`` times; a call that cannot have one is hung up, never left silent."""
        try:
            ended = await self.services.registry.ended_reason(call_id)
            log_fn = log.warning if event_type == "mediaStreamRejected" else log.info
            log_fn("stream_status", provider="bandwidth", call_id=call_id, stream_event=event_type, cause=event.get("cause"), ended=ended)
            if ended is not None:
                return  # the call is over for the bridge: its hang-up (or the caller's) is on its way
            restarts = await self.services.registry.count(call_id, RESTARTS, self.kept_ms)
            decision = await self.services.desk.restart(call_id, restarts, MAX_STREAM_RESTARTS)
            if (reason := decision.hang_up_reason) is not None:
                await self.services.registry.mark_ended(call_id, reason)
                await self.rest.hang_up(call_id, None)
                log.warning("call_hung_up", provider="bandwidth", call_id=call_id, reason=reason)
                return
            if await self.rest.redirect(call_id, base + ANSWER_PATH):
                log.info("stream_restarted", provider="bandwidth", call_id=call_id, restarts=restarts)
            else:  # the call is gone on Bandwidth's side (its disconnect may still be on its way)
                await self.services.registry.mark_ended(call_id, "call_already_ended")
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, call_id=call_id)
        except (httpx.HTTPError, RuntimeError) as exc:
            log.warning("voice_api_failed", provider="bandwidth", call_id=call_id, error=repr(exc))


def bandwidth_router(services: CarrierServices) -> APIRouter:
    """Bandwidth's answer webhook, media websocket, and status, stream-event and DTMF webhooks."""
    routes = _BandwidthWebhooks(services)
    router = APIRouter()
    router.add_api_route(ANSWER_PATH, routes.answer, methods=["POST"])
    router.add_api_websocket_route(MEDIA_PATH, routes.media)
    router.add_api_route(STATUS_PATH, routes.status, methods=["POST"])
    router.add_api_route(DTMF_PATH, routes.dtmf, methods=["POST"])
    router.add_api_route(STREAM_EVENTS_PATH, routes.stream_events, methods=["POST"])
    return router


# ----------------------------------------------------------------------- REST


class BandwidthRest:
    """The Voice API calls the bridge makes, with an OAuth 2.0 bearer token (``client_credentials``, kept until a
    minute before it expires): end a call (``{"state": "completed"}``), restart its stream (``redirectUrl``), and
    create one (a call the agent places: ``dial``; ``cancel`` ends it while it rings)."""

    def __init__(self, config: BandwidthSettings, *, client: httpx.AsyncClient | None = None) -> None:
        self._base = config.api_base_url.rstrip("/")
        self._config = config
        self._client = client or http_client(timeout=10.0)
        self._token: tuple[str, float] | None = None
        """The bearer token and when to stop using it (monotonic seconds)."""

    async def _bearer(self) -> str:
        if self._token is not None and time.monotonic() < self._token[1]:
            return self._token[0]
        config = self._config
        if not config.client_id or config.client_secret is None:
            raise RuntimeError("the Voice API needs bandwidth.client_id and bandwidth.client_secret")
        response = await self._client.post(
            config.token_url, data={"grant_type": "client_credentials"}, auth=(config.client_id, config.client_secret.get_secret_value())
        )
        response.raise_for_status()
        body = response.json()
        token, expires_in = body.get("access_token"), body.get("expires_in", 3600)
        if not isinstance(token, str) or not token:
            raise RuntimeError("Bandwidth's token response has no access_token")
        lifetime = float(expires_in) if isinstance(expires_in, int | float) else 3600.0
        self._token = (token, time.monotonic() + max(0.0, lifetime - TOKEN_EARLY_S))
        return token

    async def _update(self, call_id: str, account_id: str | None, body: dict[str, str]) -> bool:
        """``POST …/accounts/{account}/calls/{call}``: False when the call is not live (404)."""
        account = self._config.account_id or account_id
        if not account:
            raise RuntimeError("the Voice API needs bandwidth.account_id")
        url = f"{self._base}/accounts/{quote(account, safe='')}/calls/{quote(call_id, safe='')}"
        response = await self._client.post(url, json=body, headers={"Authorization": f"Bearer {await self._bearer()}"})
        if response.status_code == 401:
            self._token = None  # revoked or expired early: the next call fetches a new one
        if response.status_code == 404:
            return False
        response.raise_for_status()
        return True

    async def hang_up(self, call_id: str, account_id: str | None) -> None:
        """End the call; one that has already ended (404) counts as done. Raises ``httpx.HTTPError``."""
        await self._update(call_id, account_id, {"state": "completed"})

    @property
    def can_dial(self) -> bool:
        config = self._config
        return bool(config.account_id and config.application_id and config.client_id and config.client_secret is not None)

    async def dial(self, leg: DialLeg) -> str:
        """Create the call (``POST …/accounts/{account}/calls``): Bandwidth rings ``leg.to`` for the ring timeout
        (``callTimeout``), POSTs the ``answer`` webhook (its URL names the dial) when it is answered and the
        ``disconnect`` webhook when it ends, answered or not, with the callback credentials. Its ``callId``;
        raises ``DialRejected`` with Bandwidth's error."""
        config = self._config
        if not self.can_dial:
            raise DialRejected("not_configured", "dialling needs bandwidth.account_id, application_id, client_id and client_secret")
        body: dict[str, object] = {
            "from": leg.from_, "to": leg.to, "applicationId": config.application_id, "callTimeout": leg.ring_timeout_s,
            "answerUrl": f"{leg.base_url}{ANSWER_PATH}?dial={leg.dial_id}", "answerMethod": "POST",
            "disconnectUrl": f"{leg.base_url}{STATUS_PATH}", "disconnectMethod": "POST",
        }  # fmt: skip
        if config.callback_username is not None and config.callback_password is not None:
            body |= {"username": config.callback_username, "password": config.callback_password.get_secret_value()}
        try:
            url = f"{self._base}/accounts/{quote(str(config.account_id), safe='')}/calls"
            response = await self._client.post(url, json=body, headers={"Authorization": f"Bearer {await self._bearer()}"})
        except (httpx.HTTPError, RuntimeError) as exc:
            raise DialRejected("unreachable", repr(exc)) from exc
        if response.status_code == 401:
            self._token = None
        answer = response_object(response)
        if response.status_code != 201 or not isinstance(answer.get("callId"), str):
            kind, description = (answer.get("type"), answer.get("description"))
            raise DialRejected("refused", f"HTTP {response.status_code} {kind or ''} {description or response.text[:200]}".strip())
        return str(answer["callId"])

    async def prepare(self) -> None:
        """The Voice API's bearer token, fetched now rather than by the first dial (its own round trip)."""
        await self._bearer()

    async def cancel(self, call_id: str) -> bool:
        """End a call this application created while it rings (Bandwidth reports its ``disconnect``, cause
        ``cancel``); False where it is not live any more or the request was not taken."""
        try:
            return await self._update(call_id, None, {"state": "completed"})
        except (httpx.HTTPError, RuntimeError):
            return False

    async def redirect(self, call_id: str, url: str) -> bool:
        """Send the call to ``url`` for new BXML (a new stream); False when the call is not live."""
        body = {"redirectUrl": url, "redirectMethod": "POST"}
        if self._config.callback_username is not None and self._config.callback_password is not None:
            body |= {"username": self._config.callback_username, "password": self._config.callback_password.get_secret_value()}
        return await self._update(call_id, None, body)

    async def aclose(self) -> None:
        await self._client.aclose()


def bandwidth_rest(settings: Settings) -> BandwidthRest:
    return BandwidthRest(settings.bandwidth)


CARRIER: Final = Carrier(name="bandwidth", router=bandwidth_router, rest=bandwidth_rest)
