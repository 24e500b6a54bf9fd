"""Plivo's HTTP side: the answer webhook (Plivo XML), the media websocket, the stream status and hang-up
callbacks, V3 signature validation and the REST hang-up (telephony-protocols.md §3.2, §7).

The answer webhook mints a single-use token for the call and answers
``<Stream bidirectional="true" keepCallAlive="true">`` with it in
``extraHeaders`` (hex: Plivo lets only letters and digits through), then
``<Redirect>`` back to itself: with ``keepCallAlive`` the XML goes on once the
stream ends, so a dropped stream brings the call back here and it gets a new
stream, which resumes the same engine session (keyed by ``CallUUID``, which
``start.callId`` carries). A call that has ended gets ``<Hangup/>``.

``X-Plivo-Signature-V3`` is checked with the algorithm of Plivo's SDK
(``plivo/utils/signature_v3.py``) against the configured public URL, never a
URL rebuilt from proxied headers. A failed check is a 403 and nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Mapping
from typing import Final
from urllib.parse import parse_qs, quote, urlencode, urlparse, urlunparse
from xml.sax.saxutils import escape, quoteattr

import httpx
from fastapi import APIRouter, Request, Response, WebSocket
from pydantic import SecretStr
from starlette.datastructures import FormData

from callbridge.application.context import call_context
from callbridge.bridge.actions import ActionResult, CarrierCallAction, SendDtmf
from callbridge.bridge.answer_policy import AnswerKind
from callbridge.bridge.carrier_plugin import Carrier
from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.dialer import DialLeg, DialProgress, DialRejected
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.media import MediaStreamDriver
from callbridge.carriers.plivo.wire import PlivoCodec, stream_token_header
from callbridge.carriers.webhooks import DRAIN_RETRY_PAUSE_S, answer_url_parameters, public_base, ws_url
from callbridge.config import Settings
from callbridge.logging import get_logger
from callbridge.outbound_http import http_client, response_object

__all__ = [
    "ANSWER_PATH",
    "CARRIER",
    "HANGUP_PATH",
    "RING_PATH",
    "placed_call_progress",
    "MEDIA_PATH",
    "STATUS_PATH",
    "TRANSFER_PATH",
    "Params",
    "PlivoRest",
    "plivo_router",
    "plivo_signature_v3",
    "retry_xml",
    "stream_xml",
    "transfer_xml",
    "valid_signature_v3",
]

log = get_logger(__name__)

ANSWER_PATH: Final = "/plivo/answer"
MEDIA_PATH: Final = "/plivo/media"
STATUS_PATH: Final = "/plivo/stream-status"
HANGUP_PATH: Final = "/plivo/hangup"
RING_PATH: Final = "/plivo/ring"
"""A call the agent placed rings (its ``ring_url``)."""
_HANGUP_PROGRESS: Final[dict[str, DialProgress]] = {
    "completed": "completed", "no-answer": "no_answer", "timeout": "no_answer", "busy": "busy", "cancel": "canceled",
}  # fmt: skip
TRANSFER_PATH: Final = "/plivo/transfer"
"""Where a transferred call's new XML comes from (the Transfer API's ``aleg_url``, ``?target=…``)."""

SIGNATURE_HEADER: Final = "x-plivo-signature-v3"
NONCE_HEADER: Final = "x-plivo-signature-v3-nonce"

_FORBIDDEN = 403
_HANGUP: Final = '<?xml version="1.0" encoding="UTF-8"?><Response><Hangup/></Response>'
_BUSY: Final = '<?xml version="1.0" encoding="UTF-8"?><Response><Hangup reason="busy"/></Response>'
_EVENT_LABEL: Final = re.compile(r"[A-Za-z_]{1,40}")

Params = Mapping[str, str | list[str]]
"""Request parameters as Plivo's SDK takes them: one value, or a list for a repeated name."""


# ------------------------------------------------------------------ signatures


def _latin1(data: bytes) -> str:
    """The SDK's ``string_format`` of bytes: one character per byte."""
    return data.decode("latin-1")


def _sorted_query(params: Mapping[str, str | list[str]]) -> str:
    """``get_sorted_query_string``: ``k=v`` pairs by sorted name (and sorted values), joined by ``&``."""
    pieces = []
    for key in sorted(params):
        value = params[key]
        if isinstance(value, list):
            pieces.append("&".join(f"{key}={item}" for item in sorted(value)))
        else:
            pieces.append(f"{key}={value}")
    return "&".join(pieces)


def _sorted_params(params: Params) -> str:
    """``get_sorted_params_string``: name and value run together, by sorted name (and sorted values)."""
    pieces = []
    for key in sorted(params):
        value = params[key]
        if isinstance(value, list):
            pieces.append("".join(f"{key}{item}" for item in sorted(value)))
        else:
            pieces.append(f"{key}{value}")
    return "".join(pieces)


def _signed_url(method: str, url: str, params: Params) -> bytes:
    """``construct_get_url`` / ``construct_post_url`` of the SDK. The URL's own query is parsed (as bytes, read
    back one character per byte, as the SDK does) and re-serialised sorted; a POST appends its sorted
    parameters after ``?`` (after ``?query.`` when the URL has a query)."""
    parsed = urlparse(url.encode("utf-8"))
    base = urlunparse((parsed.scheme.decode(), parsed.netloc.decode(), parsed.path.decode(), "", "", "")).encode()
    # The SDK parses the query as bytes and reads keys and values back one character per byte (latin-1).
    from_query: dict[str, str | list[str]] = {
        key: values for key, values in parse_qs(parsed.query.decode("latin-1"), keep_blank_values=True, encoding="latin-1").items()
    }
    if method.upper() == "GET":
        merged = {**params, **from_query}
        query = _sorted_query(merged)
        return base + ("?" + query).encode() if query else base
    query = _sorted_query(from_query)
    if query or params:
        base += ("?" + query).encode()
    if query and params:
        base += b"."
    return base + _sorted_params(params).encode()


def plivo_signature_v3(auth_token: str, method: str, url: str, params: Params, nonce: str) -> str:
    """Plivo's V3 signature: base64(HMAC-SHA256(auth token, signed URL + "." + nonce)), as plivo-python 4.63
    computes it (the signed URL as UTF-8 text; the nonce, ASCII in practice, read one character per byte)."""
    message = f"{_signed_url(method, url, params).decode()}.{_latin1(nonce.encode())}".encode()
    digest = hmac.new(auth_token.encode(), message, hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def valid_signature_v3(
    auth_token: str, method: str, url: str, params: Params, nonce: str | None, header: str | None
) -> bool:
    """Whether ``header`` (possibly several signatures, comma-separated) holds the request's signature."""
    if not nonce or not header:
        return False
    expected = plivo_signature_v3(auth_token, method, url, params, nonce).encode()
    return any(hmac.compare_digest(expected, candidate.strip().encode()) for candidate in header.split(","))


class _Signatures:
    def __init__(self, settings: Settings) -> None:
        config = settings.plivo
        self.enabled = config.validate_signatures
        self._token = config.auth_token.get_secret_value() if config.auth_token else None

    def valid(self, method: str, urls: tuple[str, ...], params: Params, nonce: str | None, header: str | None) -> bool:
        if not self.enabled:
            return True
        if self._token is None:
            return False
        return any(valid_signature_v3(self._token, method, url, params, nonce, header) for url in urls)


# ------------------------------------------------------------------------ XML


def stream_xml(base: str, token: str, content_type: str) -> str:
    """The answer: a bidirectional ``<Stream>`` carrying the call's token, then ``<Redirect>`` here for a new
    stream once it ends (``keepCallAlive``: the XML goes on only after the stream)."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        "<Response>"
        '<Stream bidirectional="true" keepCallAlive="true" audioTrack="inbound"'
        f" contentType={quoteattr(content_type)}"
        f' statusCallbackUrl={quoteattr(base + STATUS_PATH)} statusCallbackMethod="POST"'
        f" extraHeaders={quoteattr(stream_token_header(token))}>"
        f"{escape(ws_url(base) + MEDIA_PATH)}</Stream>"
        f'<Redirect method="POST">{escape(base + ANSWER_PATH)}</Redirect>'
        "</Response>"
    )


def retry_xml(base: str) -> str:
    """A draining process's answer to a known call's reconnect: ``<Wait>``, then ``<Redirect>`` to the public
    answer URL, which the load balancer sends to a ready process (as other redirectable carriers are)."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<Response><Wait length="{DRAIN_RETRY_PAUSE_S}"/>'
        f'<Redirect method="POST">{escape(base + ANSWER_PATH)}</Redirect></Response>'
    )


def transfer_xml(target: str) -> str:
    """A transfer's new instructions: ``<Dial>`` the number, or the SIP URI (``<User>``)."""
    noun = f"<User>{escape(target)}</User>" if target.startswith(("sip:", "sips:")) else f"<Number>{escape(target.lstrip('+'))}</Number>"
    return f'<?xml version="1.0" encoding="UTF-8"?><Response><Dial>{noun}</Dial></Response>'


# --------------------------------------------------------------------- router


def _params(form: FormData | Mapping[str, str]) -> dict[str, str | list[str]]:
    """Form or query parameters as the signature takes them (a list only for a repeated name)."""
    if not isinstance(form, FormData):
        return dict(form)
    params: dict[str, str | list[str]] = {}
    for key in form:
        values = [value for value in form.getlist(key) if isinstance(value, str)]
        if values:
            params[key] = values[0] if len(values) == 1 else values
    return params


def _first(params: Params, key: str) -> str | None:
    value = params.get(key)
    if isinstance(value, list):
        return value[0] if value else None
    return value or None


class _PlivoWebhooks:
    """Plivo's webhooks and media socket, a method a route (``plivo_router`` mounts them)."""

    def __init__(self, services: CarrierServices) -> None:
        self.services, self.settings = services, services.settings
        self.config = self.settings.plivo
        self.signatures = _Signatures(self.settings)
        if self.signatures.enabled and self.config.auth_token is None:
            log.info("carrier_not_configured", provider="plivo", detail="no plivo.auth_token: every plivo request gets 403")

    async def _checked(self, request: Request, path: str) -> dict[str, str | list[str]] | None:
        """The request's parameters when its signature holds, else None. A GET is signed over its URL (query
        included), a POST over its URL and form."""
        base = public_base(self.settings, str(request.base_url))
        query = f"?{request.url.query}" if request.url.query else ""
        if request.method == "GET":
            params = _params(request.query_params)
            signed: Params = {}
        else:
            params = signed = _params(await request.form())
        nonce, header = request.headers.get(NONCE_HEADER), request.headers.get(SIGNATURE_HEADER)
        if not self.signatures.valid(request.method, (base + path + query,), signed, nonce, header):
            log.warning("signature_invalid", provider="plivo", path=path, call_id=_first(params, "CallUUID"), url_checked=base + path + query)
            return None
        if self.signatures.enabled and nonce is not None and not await self.services.replays.first_sight(request, "plivo", nonce):
            return None  # the nonce is signed with the request: the same one again is a replay
        return params

    async def answer(self, request: Request) -> Response:
        params = await self._checked(request, ANSWER_PATH)
        if params is None:
            return Response(status_code=_FORBIDDEN)
        call_id = _first(params, "CallUUID")
        if not call_id:
            return Response("CallUUID missing", status_code=400)
        base = public_base(self.settings, str(request.base_url))
        context = call_context(
            call_id=call_id, carrier="plivo", caller=_first(params, "From"), called=_first(params, "To"),
            caller_name=_first(params, "CallerName"), forwarded_from=_first(params, "ForwardedFrom"),
            outbound=_first(params, "Direction") == "outbound", account_id=_first(params, "ParentAuthID"), plus_implied=True,
            parameters=[*answer_url_parameters(request), *((key, value) for key in params if (value := _first(params, key)) is not None)],
            allowed=self.settings.app.context_parameters,
        )  # fmt: skip; SIP headers are X-PH-… parameters
        decision = await self.services.desk.decide_answer(  # a placed call: its RequestUUID is what the Call API gave
            call_id, "plivo", context=context, dial_id=request.query_params.get("dial"), dialled_as=_first(params, "RequestUUID")
        )
        match decision.kind:
            case AnswerKind.HANG_UP:
                xml = _HANGUP
            case AnswerKind.RETRY_ELSEWHERE:
                xml = retry_xml(base)
            case AnswerKind.BUSY:
                xml = _BUSY
            case AnswerKind.TRANSFER:
                assert decision.target is not None
                xml = transfer_xml(decision.target)
            case AnswerKind.ANSWER:
                assert decision.token is not None
                log.info("call_answered", call_id=call_id, provider="plivo", caller=_first(params, "From"))
                xml = stream_xml(base, decision.token, self.config.content_type)
        return Response(xml, media_type="application/xml")

    async def media(self, websocket: WebSocket) -> None:
        # UNSURE whether Plivo signs the upgrade: when it carries a V3 signature, it must hold (over the wss URL
        # as written in the XML, or its https twin); without one, the single-use token in ``start`` decides.
        header = websocket.headers.get(SIGNATURE_HEADER)
        if header is not None:
            base = public_base(self.settings, str(websocket.base_url).replace("ws", "http", 1))
            urls = (ws_url(base) + MEDIA_PATH, base + MEDIA_PATH)
            if not self.signatures.valid("GET", urls, {}, websocket.headers.get(NONCE_HEADER), header):
                log.warning("signature_invalid", provider="plivo", path=MEDIA_PATH, url_checked=urls[0])
                await websocket.close(code=1008)  # before accept: the upgrade is answered 403
                return
        await websocket.accept()
        await MediaStreamDriver(websocket, PlivoCodec(), self.services).run()

    async def stream_status(self, request: Request) -> Response:
        params = await self._checked(request, STATUS_PATH)
        if params is None:
            return Response(status_code=_FORBIDDEN)
        event = _first(params, "Event") or "unknown"
        label = event if _EVENT_LABEL.fullmatch(event) else "other"
        self.services.metrics.stream_status.labels("plivo", label).inc()
        log_fn = log.warning if "drop" in event.lower() or "fail" in event.lower() else log.info
        log_fn(
            "stream_status",
            provider="plivo",
            call_id=_first(params, "CallUUID"),
            stream_id=_first(params, "StreamID") or _first(params, "StreamId"),
            stream_event=event,
            error=_first(params, "Error") or _first(params, "ErrorMessage"),
        )
        return Response(status_code=204)

    async def transfer(self, request: Request) -> Response:
        """The XML a call transferred by the agent runs (signed like every webhook; the target must still be one
        of ``call_actions.transfer_targets``, whatever the URL says)."""
        params = await self._checked(request, TRANSFER_PATH)
        if params is None:
            return Response(status_code=_FORBIDDEN)
        target = request.query_params.get("target")
        if not self.settings.call_actions.enabled or target not in self.settings.call_actions.transfer_targets:
            log.warning("transfer_refused", provider="plivo", call_id=_first(params, "CallUUID"), target=target)
            return Response(_HANGUP, media_type="application/xml")
        log.info("call_transferred", provider="plivo", call_id=_first(params, "CallUUID"), target=target)
        return Response(transfer_xml(target), media_type="application/xml")

    async def hangup(self, request: Request) -> Response:
        """The application's Hangup URL (optional, recommended): the call is over. Its open stream here ends as
        a hang-up (not a drop), a late stream or redirect is refused, and no engine session is kept."""
        params = await self._checked(request, HANGUP_PATH)
        if params is None:
            return Response(status_code=_FORBIDDEN)
        call_id = _first(params, "CallUUID")
        if not call_id:
            return Response(status_code=204)
        cause = _first(params, "HangupCause") or ""
        log.info("call_hangup_callback", provider="plivo", call_id=call_id, cause=cause)
        request_uuid = _first(params, "RequestUUID")
        if self.services.dialer is not None and request_uuid:  # a call the agent placed: how it went
            status = _first(params, "CallStatus") or ""
            self.services.dialer.progress("plivo", request_uuid, placed_call_progress(status, cause), f"{status}: {cause}"[:300])
        await self.services.call_ended_by_carrier(call_id, EndCause(EndReason.CALLER_HUNG_UP))
        return Response(status_code=204)

    async def ring(self, request: Request) -> Response:
        """A call the agent placed rings (the ``ring_url`` its Call API request named)."""
        params = await self._checked(request, RING_PATH)
        if params is None:
            return Response(status_code=_FORBIDDEN)
        request_uuid = _first(params, "RequestUUID")
        if self.services.dialer is not None and request_uuid:
            self.services.dialer.progress("plivo", request_uuid, "ringing")
        return Response(status_code=204)


def plivo_router(services: CarrierServices) -> APIRouter:
    """Plivo's answer webhook, media websocket, stream status callback and hang-up callback."""
    routes = _PlivoWebhooks(services)
    router = APIRouter()
    router.add_api_route(ANSWER_PATH, routes.answer, methods=["GET", "POST"])
    router.add_api_websocket_route(MEDIA_PATH, routes.media)
    router.add_api_route(STATUS_PATH, routes.stream_status, methods=["GET", "POST"])
    router.add_api_route(TRANSFER_PATH, routes.transfer, methods=["GET", "POST"])
    router.add_api_route(HANGUP_PATH, routes.hangup, methods=["GET", "POST"])
    router.add_api_route(RING_PATH, routes.ring, methods=["GET", "POST"])
    return router


# ----------------------------------------------------------------------- REST


class PlivoRest:
    """The REST calls the bridge makes (basic auth): end a call (``DELETE …/Call/{uuid}/``), and the agent's
    actions: send digits (``POST …/Call/{uuid}/DTMF/``), transfer (``POST …/Call/{uuid}/`` with ``aleg_url``
    → our ``TRANSFER_PATH``, which answers ``<Dial>``)."""

    def __init__(
        self,
        base_url: str,
        auth_id: str | None,
        auth_token: SecretStr | None,
        *,
        client: httpx.AsyncClient | None = None,
        public_url: str | None = None,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._public_url = public_url.rstrip("/") if public_url else None
        self._auth_id = auth_id
        self._token = auth_token.get_secret_value() if auth_token else None
        self._client = client or http_client(timeout=10.0)

    async def hang_up(self, call_id: str, account_id: str | None) -> None:
        """Hang up the call; one that has already ended (404) counts as done. Raises ``httpx.HTTPError``.

        ``account_id`` (``start.accountId``) is only a fallback: the configured ``auth_id`` owns the API."""
        auth_id = self._auth_id or account_id
        if not auth_id or not self._token:
            raise RuntimeError("hang-up needs plivo.auth_id and plivo.auth_token")
        response = await self._client.delete(
            f"{self._base}/v1/Account/{quote(auth_id, safe='')}/Call/{quote(call_id, safe='')}/",
            auth=(auth_id, self._token),
        )
        if response.status_code == 404:
            return  # already over
        response.raise_for_status()

    @property
    def can_dial(self) -> bool:
        return self._auth_id is not None and self._token is not None

    async def dial(self, leg: DialLeg) -> str:
        """Make the call (``POST …/Account/{auth_id}/Call/``): Plivo rings ``leg.to`` for the ring timeout, POSTs the
        ``ring_url`` while it rings, the ``answer_url`` (naming the dial) when it is answered and the ``hangup_url``
        when it ends, answered or not. Its ``request_uuid`` (the callbacks carry it as ``RequestUUID``); raises
        ``DialRejected`` with Plivo's error."""
        if self._auth_id is None or self._token is None:
            raise DialRejected("not_configured", "dialling needs plivo.auth_id and plivo.auth_token")
        body = {
            "from": leg.from_.removeprefix("+"), "to": leg.to.removeprefix("+"), "ring_timeout": leg.ring_timeout_s,
            "answer_url": f"{leg.base_url}{ANSWER_PATH}?dial={leg.dial_id}", "answer_method": "POST",
            "ring_url": f"{leg.base_url}{RING_PATH}", "ring_method": "POST",
            "hangup_url": f"{leg.base_url}{HANGUP_PATH}", "hangup_method": "POST",
        }  # fmt: skip; Plivo's numbers: E.164 without the +
        try:
            response = await self._client.post(f"{self._base}/v1/Account/{quote(self._auth_id, safe='')}/Call/", json=body, auth=(self._auth_id, self._token))
        except httpx.HTTPError as exc:
            raise DialRejected("unreachable", repr(exc)) from exc
        answer = response_object(response)
        request_uuid = answer.get("request_uuid")
        if response.status_code != 201 or not isinstance(request_uuid, str) or not request_uuid:
            error = answer.get("error")
            raise DialRejected("refused", f"HTTP {response.status_code} {error or response.text[:200]}".strip())
        return request_uuid

    async def prepare(self) -> None:
        """Nothing to get ready: every dial is one request with the credentials as they are."""

    async def cancel(self, call_id: str) -> bool:
        """Cancel a call this account made that is not answered yet (``DELETE …/Request/{request_uuid}/``); Plivo
        reports it to the hang-up URL. False where it is not ringing any more or the request was not taken."""
        if self._auth_id is None or self._token is None:
            return False
        url = f"{self._base}/v1/Account/{quote(self._auth_id, safe='')}/Request/{quote(call_id, safe='')}/"
        try:
            response = await self._client.delete(url, auth=(self._auth_id, self._token))
        except httpx.HTTPError:
            return False
        return response.status_code < 300

    async def perform(self, call_id: str, account_id: str | None, action: CarrierCallAction) -> ActionResult:
        auth_id = self._auth_id or account_id
        if not auth_id or not self._token:
            return ActionResult.failed("not_configured", "plivo.auth_id and plivo.auth_token are needed")
        call_url = f"{self._base}/v1/Account/{quote(auth_id, safe='')}/Call/{quote(call_id, safe='')}/"
        if isinstance(action, SendDtmf):
            response = await self._client.post(call_url + "DTMF/", json={"digits": action.digits, "legs": "aleg"}, auth=(auth_id, self._token))
        else:
            if self._public_url is None:
                return ActionResult.failed("not_configured", "a transfer needs server.public_url (Plivo fetches its XML)")
            aleg_url = f"{self._public_url}{TRANSFER_PATH}?{urlencode({'target': action.target})}"
            body = {"legs": "aleg", "aleg_url": aleg_url, "aleg_method": "POST"}
            response = await self._client.post(call_url, json=body, auth=(auth_id, self._token))
        if response.status_code == 404:
            return ActionResult.failed("call_ended", "HTTP 404")
        if response.status_code >= 300:
            return ActionResult.failed("carrier_error", f"HTTP {response.status_code}")
        return ActionResult.done(call_left=not isinstance(action, SendDtmf))

    async def aclose(self) -> None:
        await self._client.aclose()


def placed_call_progress(status: str, cause: str) -> DialProgress:
    """A placed call's hang-up callback, as the dialer follows it: its ``CallStatus`` (``busy``, ``no-answer``,
    ``timeout``, ``cancel``, ``failed``, ``completed``), a rejection told apart by its ``HangupCause``."""
    return _HANGUP_PROGRESS.get(status) or ("declined" if "reject" in cause.lower() else "failed")


def plivo_rest(settings: Settings) -> PlivoRest:
    config = settings.plivo
    return PlivoRest(config.api_base_url, config.auth_id, config.auth_token, public_url=settings.server.public_url)


CARRIER: Final = Carrier(name="plivo", router=plivo_router, rest=plivo_rest)
