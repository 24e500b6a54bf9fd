"""Twilio's HTTP side: the answer webhook (TwiML), the media websocket upgrade, the stream status callback,
signature validation and the REST hang-up (telephony-protocols.md §1.1, §1.6, §1.7, §7).

The answer webhook mints a single-use token for the call and answers
``<Connect><Stream>`` with it as a ``<Parameter>``, then ``<Redirect>`` back to
itself: if the stream drops, Twilio runs the redirect and the call gets a new
stream, which resumes the same engine session (a draining process answers that
redirect with ``<Pause>`` and ``<Redirect>`` again, for the load balancer to
send to a ready process: ``twiml_retry``). ``X-Twilio-Signature`` is
checked with Twilio's own ``RequestValidator`` against the configured public
URL — ``wss://`` and no parameters for the upgrade — never against a URL
rebuilt from proxied headers. A failed check is a 403 and nothing else.

A signed webhook is taken once (``replay.ReplayGuard``): its signature, which covers its URL and parameters
and nothing of when, is remembered, and the same signature again is a 403. Twilio's requests for one call's
redirects would be alike (same URL, same parameters), so each ``<Redirect>`` URL carries a fresh
``?redirect=`` nonce: every redirect Twilio runs is a request signed as no other.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from xml.sax.saxutils import escape, quoteattr

import httpx
from fastapi import APIRouter, Request, Response, WebSocket
from pydantic import SecretStr
from twilio.request_validator import RequestValidator

from callbridge.application import CallContext
from callbridge.application.context import call_context
from callbridge.bridge.actions import ActionResult, CarrierCallAction, SendDtmf
from callbridge.bridge.answer_policy import AnswerKind
from callbridge.bridge.carrier_plugin import Carrier
from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.dialer import DialLeg, DialProgress, DialRejected
from callbridge.bridge.media import MediaStreamDriver
from callbridge.carriers.spec import UpgradeCheck, UpgradeProof
from callbridge.carriers.twilio.wire import ACCOUNT_PARAM, TwilioCodec
from callbridge.carriers.webhooks import DRAIN_RETRY_PAUSE_S, answer_url_parameters, public_base, ws_url
from callbridge.config import Settings
from callbridge.logging import get_logger
from callbridge.outbound_http import http_client, response_object

__all__ = [
    "CARRIER",
    "TwilioDialect",
    "TwilioRest",
    "TwilioSignatures",
    "public_base",
    "twilio_compatible_router",
    "twilio_dialect",
    "twiml_connect",
    "twiml_dial",
]

log = get_logger(__name__)

_FORBIDDEN = 403


@dataclass(frozen=True, slots=True)
class TwilioDialect:
    """A carrier that speaks Twilio's TwiML and Media Streams (Twilio itself, and dialects of it)."""

    name: str
    signature_header: str
    signing_key: SecretStr | None
    validate_signatures: bool
    codec: Callable[[], TwilioCodec]
    stream_attributes: dict[str, str] = field(default_factory=dict)
    """Extra ``<Stream>`` attributes (a dialect's ``codec="…"``)."""
    upgrade_signed: bool = True
    """The carrier signs its media websocket's upgrade (Twilio documents it). Where it does not (a dialect
    documents signatures on webhooks only), an unsigned upgrade is accepted and the stream must show its
    single-use token, as most carriers' do; a signature that is there must still be right."""

    @property
    def voice_path(self) -> str:
        return f"/{self.name}/voice"

    @property
    def media_path(self) -> str:
        return f"/{self.name}/media"

    @property
    def status_path(self) -> str:
        return f"/{self.name}/stream-status"

    @property
    def call_status_path(self) -> str:
        """Where the carrier reports how a call the bridge placed goes (its ``StatusCallback``)."""
        return f"/{self.name}/call-status"

    def twiml_connect(self, base: str, token: str, account: str | None = None) -> str:
        """``<Connect><Stream>`` with the call's token, then ``<Redirect>`` here for a new stream if it drops.
        ``account``: the ``AccountSid`` the answer webhook came with, as a ``<Parameter>`` too (``ACCOUNT_PARAM``):
        a sender whose ``start`` leaves ``accountSid`` empty is still known by it, and hung up through it."""
        account_parameter = f'<Parameter name="{ACCOUNT_PARAM}" value={quoteattr(account)}/>' if account else ""
        attributes = "".join(f" {name}={quoteattr(value)}" for name, value in self.stream_attributes.items())
        return (
            '<?xml version="1.0" encoding="UTF-8"?>'
            "<Response><Connect>"
            f"<Stream url={quoteattr(ws_url(base) + self.media_path)}{attributes}"
            f' statusCallback={quoteattr(base + self.status_path)} statusCallbackMethod="POST">'
            f'<Parameter name="token" value={quoteattr(token)}/>{account_parameter}'
            "</Stream></Connect>"
            f'<Redirect method="POST">{escape(self.redirect_url(base))}</Redirect>'
            "</Response>"
        )

    def twiml_retry(self, base: str) -> str:
        """A draining process's answer to a known call's reconnect: ``<Pause>``, then ``<Redirect>`` to the public
        answer URL, which the load balancer, its readiness probe failing here by then, sends to a ready process.
        The call hears ``DRAIN_RETRY_PAUSE_S`` of silence instead of ending on ``<Reject>``."""
        return (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f'<Response><Pause length="{DRAIN_RETRY_PAUSE_S}"/><Redirect method="POST">{escape(self.redirect_url(base))}</Redirect></Response>'
        )

    def redirect_url(self, base: str) -> str:
        """The answer URL, with a nonce that makes the request Twilio signs for this redirect unlike any other."""
        return f"{base}{self.voice_path}?redirect={secrets.token_hex(8)}"


def twilio_dialect(settings: Settings) -> TwilioDialect:
    return TwilioDialect(
        name="twilio",
        signature_header="x-twilio-signature",
        signing_key=settings.twilio.auth_token,
        validate_signatures=settings.twilio.validate_signatures,
        codec=TwilioCodec,
        upgrade_signed=not settings.twilio.unsigned_upgrades,
    )


def twiml_connect(base: str, token: str) -> str:
    """Twilio's answer: ``<Connect><Stream>`` with the call's token, then ``<Redirect>``."""
    return TwilioDialect("twilio", "", None, True, TwilioCodec).twiml_connect(base, token)


def twiml_dial(target: str) -> str:
    """A transfer: ``<Dial>`` the number, or ``<Dial><Sip>`` a SIP URI."""
    noun = f"<Sip>{escape(target)}</Sip>" if target.startswith(("sip:", "sips:")) else escape(target)
    return f'<?xml version="1.0" encoding="UTF-8"?><Response><Dial>{noun}</Dial></Response>'


_STATUS_EVENTS: Final = ("initiated", "ringing", "answered", "completed")
"""The progress a placed call's ``StatusCallback`` is sent (Twilio sends only ``completed`` unless asked)."""
_CALL_PROGRESS: Final[Mapping[str, DialProgress]] = {
    "ringing": "ringing", "in-progress": "answered", "completed": "completed", "busy": "busy", "no-answer": "no_answer",
    "failed": "failed", "canceled": "canceled",
}  # fmt: skip
"""Twilio's ``CallStatus`` in callbridge's words (``queued`` and ``initiated`` say nothing new)."""

_HANGUP = '<?xml version="1.0" encoding="UTF-8"?><Response><Hangup/></Response>'
_BUSY = '<?xml version="1.0" encoding="UTF-8"?><Response><Reject reason="busy"/></Response>'


class TwilioSignatures:
    """Twilio's HMAC signature check (``RequestValidator``) with a dialect's key; always valid when switched off."""

    def __init__(self, dialect: TwilioDialect) -> None:
        self.enabled = dialect.validate_signatures
        key = dialect.signing_key
        self._validator = RequestValidator(key.get_secret_value()) if key else None

    def valid(self, url: str, params: dict[str, Any], signature: str | None) -> bool:
        if not self.enabled:
            return True
        if self._validator is None or not signature:
            return False
        return bool(self._validator.validate(url, params, signature))


def signature_upgrade(dialect: TwilioDialect) -> UpgradeCheck:
    """At the generic ``/media`` URL: an upgrade that carries this dialect's signature header must be signed for
    that URL (its stream still needs our token: the signature is the same for every call)."""
    signatures = TwilioSignatures(dialect)

    def check(url: str, headers: Mapping[str, str], peer: str | None) -> UpgradeProof | None:
        signature = headers.get(dialect.signature_header)
        if signature is None:
            return None
        return UpgradeProof() if signatures.valid(url, {}, signature) else UpgradeProof("bad_signature")

    return check


def twilio_compatible_router(services: CarrierServices, dialect: TwilioDialect) -> APIRouter:
    """The answer webhook, media websocket and stream status callback of a Twilio-compatible carrier."""
    settings = services.settings
    signatures = TwilioSignatures(dialect)
    name, header = dialect.name, dialect.signature_header
    if signatures.enabled and dialect.signing_key is None:
        log.info("carrier_not_configured", provider=name, detail=f"no {name} signing key: every {name} request gets 403")
    router = APIRouter()

    @router.post(dialect.voice_path)
    async def voice(request: Request) -> Response:
        form = {key: str(value) for key, value in (await request.form()).items()}
        base = public_base(settings, str(request.base_url))
        url = base + dialect.voice_path + (f"?{request.url.query}" if request.url.query else "")
        signature = request.headers.get(header)
        if not signatures.valid(url, form, signature):
            log.warning("signature_invalid", provider=name, path=dialect.voice_path, call_id=form.get("CallSid"), url_checked=url)
            return Response(status_code=_FORBIDDEN)
        if signatures.enabled and signature is not None and not await services.replays.first_sight(request, name, signature):
            return Response(status_code=_FORBIDDEN)
        call_id = form.get("CallSid")
        if not call_id:
            return Response("CallSid missing", status_code=400)
        context = twilio_context(name, [*answer_url_parameters(request), *form.items()], settings.app.context_parameters)
        decision = await services.desk.decide_answer(call_id, name, context=context, dial_id=request.query_params.get("dial"))
        match decision.kind:
            case AnswerKind.HANG_UP:
                twiml = _HANGUP
            case AnswerKind.RETRY_ELSEWHERE:
                twiml = dialect.twiml_retry(base)
            case AnswerKind.BUSY:
                twiml = _BUSY
            case AnswerKind.TRANSFER:
                assert decision.target is not None
                twiml = twiml_dial(decision.target)
            case AnswerKind.ANSWER:
                assert decision.token is not None
                log.info("call_answered", call_id=call_id, provider=name, caller=form.get("From"))
                twiml = dialect.twiml_connect(base, decision.token, form.get("AccountSid"))
        return Response(twiml, media_type="application/xml")

    @router.websocket(dialect.media_path)
    async def media(websocket: WebSocket) -> None:
        base = public_base(settings, str(websocket.base_url).replace("ws", "http", 1))
        signature = websocket.headers.get(header)
        checked = ws_url(base) + dialect.media_path
        if (signature is not None or dialect.upgrade_signed) and not signatures.valid(checked, {}, signature):
            log.warning("signature_invalid", provider=name, path=dialect.media_path, url_checked=checked)
            await websocket.close(code=1008)  # before accept: the upgrade is answered 403
            return
        await websocket.accept()
        await MediaStreamDriver(websocket, dialect.codec(), services).run()

    @router.post(dialect.status_path)
    async def stream_status(request: Request) -> Response:
        form = await signed_callback(request, services, dialect, signatures, dialect.status_path)
        if form is None:
            return Response(status_code=_FORBIDDEN)
        event = form.get("StreamEvent", "unknown")
        services.metrics.stream_status.labels(name, event).inc()
        log_fn = log.warning if event == "stream-error" else log.info
        log_fn("stream_status", provider=name, call_id=form.get("CallSid"), stream_id=form.get("StreamSid"), stream_event=event, error=form.get("StreamError"))
        return Response(status_code=204)

    router.add_api_route(dialect.call_status_path, call_status_route(services, dialect, signatures), methods=["POST"])
    return router


async def signed_callback(
    request: Request, services: CarrierServices, dialect: TwilioDialect, signatures: TwilioSignatures, path: str
) -> dict[str, str] | None:
    """The form of a status callback to ``path``, signed for the public URL and not seen before; None where it is not
    (logged): the caller answers 403."""
    form = {key: str(value) for key, value in (await request.form()).items()}
    signature = request.headers.get(dialect.signature_header)
    checked = public_base(services.settings, str(request.base_url)) + path
    if not signatures.valid(checked, form, signature):
        log.warning("signature_invalid", provider=dialect.name, path=path, url_checked=checked)
        return None
    if signatures.enabled and signature is not None and not await services.replays.first_sight(request, dialect.name, signature):
        return None
    return form


def call_status_route(services: CarrierServices, dialect: TwilioDialect, signatures: TwilioSignatures) -> Callable[[Request], Awaitable[Response]]:
    """The call status callback of a call the bridge placed: its progress to the dialer."""

    async def call_status(request: Request) -> Response:
        """How a call the bridge placed goes (``StatusCallback``): ringing, answered, and how it ended."""
        form = await signed_callback(request, services, dialect, signatures, dialect.call_status_path)
        if form is None:
            return Response(status_code=_FORBIDDEN)
        progress = _CALL_PROGRESS.get(form.get("CallStatus", ""))
        call_id = form.get("CallSid")
        if progress is not None and call_id and services.dialer is not None:
            detail = f"{form.get('CallStatus')}" + (f" (SIP {form['SipResponseCode']})" if form.get("SipResponseCode") else "")
            services.dialer.progress(dialect.name, call_id, progress, detail)
        return Response(status_code=204)

    return call_status


class TwilioRest:
    """The REST calls the bridge makes on Twilio's API or a compatible one: end a call (``Status=completed``),
    transfer it (new ``Twiml`` with ``<Dial>``), place one (``dial``: where ``account`` is configured)."""

    def __init__(
        self,
        base_url: str,
        token: SecretStr | None,
        *,
        username: str | None = None,
        client: httpx.AsyncClient | None = None,
        account: str | None = None,
        dialect: str = "twilio",
    ) -> None:
        self._base = base_url.rstrip("/")
        self._token = token.get_secret_value() if token else None
        self._username = username
        self._client = client or http_client(timeout=10.0)
        self._account = account
        self._dialect = dialect

    @property
    def can_dial(self) -> bool:
        return self._account is not None and self._token is not None

    async def dial(self, leg: DialLeg) -> str:
        """Create the call (``POST …/Calls.json``): Twilio rings ``leg.to`` from ``leg.from_`` for the ring timeout,
        POSTs the answer webhook (the URL names the dial) when it is answered, and reports its progress to the call
        status callback. Its ``CallSid``; raises ``DialRejected`` with Twilio's code and message."""
        if self._account is None or self._token is None:
            raise DialRejected("not_configured", "no account_sid or auth_token to dial with")
        data = {
            "To": leg.to, "From": leg.from_, "Url": f"{leg.base_url}/{self._dialect}/voice?dial={leg.dial_id}", "Method": "POST",
            "StatusCallback": f"{leg.base_url}/{self._dialect}/call-status", "StatusCallbackMethod": "POST",
            "StatusCallbackEvent": list(_STATUS_EVENTS), "Timeout": str(leg.ring_timeout_s),
        }  # fmt: skip
        try:
            response = await self._client.post(
                f"{self._base}/2010-04-01/Accounts/{self._account}/Calls.json", data=data, auth=(self._username or self._account, self._token)
            )
        except httpx.HTTPError as exc:
            raise DialRejected("unreachable", repr(exc)) from exc
        answer = response_object(response)
        if response.status_code not in (200, 201) or not isinstance(answer.get("sid"), str):
            code, message = (answer.get("code"), answer.get("message"))
            raise DialRejected("refused", f"HTTP {response.status_code} {code or ''} {message or response.text[:200]}".strip())
        return str(answer["sid"])

    async def hang_up(self, call_id: str, account_id: str | None) -> None:
        """Complete the call; a call that has already ended counts as done. Raises ``httpx.HTTPError``."""
        if not account_id or not self._token:
            raise RuntimeError("hang-up needs the call's account id and the API token")
        response = await self._client.post(
            f"{self._base}/2010-04-01/Accounts/{account_id}/Calls/{call_id}.json",
            data={"Status": "completed"},
            auth=(self._username or account_id, self._token),
        )
        if response.status_code in (404, 409) or (response.status_code == 400 and "not in-progress" in response.text):
            return  # already over
        response.raise_for_status()

    async def prepare(self) -> None:
        """Nothing to get ready: every dial is one request with the credentials as they are."""

    async def cancel(self, call_id: str) -> bool:
        """Cancel a call this account created that has not been answered (``Status=canceled``): Twilio stops its
        ringing and reports it ``canceled``. False where it is not ringing any more (answered, over) or Twilio did
        not take the request."""
        if self._account is None or self._token is None:
            return False
        try:
            response = await self._client.post(
                f"{self._base}/2010-04-01/Accounts/{self._account}/Calls/{call_id}.json", data={"Status": "canceled"},
                auth=(self._username or self._account, self._token),
            )  # fmt: skip
        except httpx.HTTPError:
            return False
        return response.status_code < 300

    async def perform(self, call_id: str, account_id: str | None, action: CarrierCallAction) -> ActionResult:
        """A transfer replaces the call's TwiML with ``<Dial>`` (the stream ends, the call leaves the bridge).
        DTMF is unsupported: the only TwiML for it (``<Play digits>``) would end the stream too."""
        if isinstance(action, SendDtmf):
            return ActionResult.failed("unsupported", "DTMF cannot be sent while the media stream runs")
        if not account_id or not self._token:
            return ActionResult.failed("not_configured", "a transfer needs the call's account id and the API token")
        response = await self._client.post(
            f"{self._base}/2010-04-01/Accounts/{account_id}/Calls/{call_id}.json",
            data={"Twiml": twiml_dial(action.target)},
            auth=(self._username or account_id, self._token),
        )
        if response.status_code in (404, 409) or (response.status_code == 400 and "not in-progress" in response.text):
            return ActionResult.failed("call_ended", f"HTTP {response.status_code}")
        if response.status_code >= 300:
            return ActionResult.failed("carrier_error", f"HTTP {response.status_code}")
        return ActionResult.done(call_left=True)

    async def aclose(self) -> None:
        await self._client.aclose()


CARRIER = Carrier(
    name="twilio",
    router=lambda services: twilio_compatible_router(services, twilio_dialect(services.settings)),
    rest=lambda settings: TwilioRest(settings.twilio.api_base_url, settings.twilio.auth_token, account=settings.twilio.account_sid),
    generic_upgrade=lambda settings: signature_upgrade(twilio_dialect(settings)),
)


def twilio_context(carrier: str, fields: list[tuple[str, str]], allowed: list[str]) -> CallContext:
    """The call as Twilio's voice webhook (or a dialect's) describes it: ``fields``, the answer URL's query
    parameters, then the form's; a SIP trunk's headers come as ``SipHeader_X-…`` fields, named so in
    ``app.context_parameters`` too."""
    form = dict(fields)
    return call_context(
        call_id=form["CallSid"], carrier=carrier, caller=form.get("From") or form.get("Caller"),
        called=form.get("To") or form.get("Called"), caller_name=form.get("CallerName"),
        forwarded_from=form.get("ForwardedFrom"), account_id=form.get("AccountSid"),
        outbound=form.get("Direction", "inbound") != "inbound", parameters=fields, allowed=allowed,
    )  # fmt: skip
