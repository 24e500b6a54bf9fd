"""The SIP user-agent client for the calls the agent places (#42), sans-I/O: an INVITE through the trunk, its
progress, and the dialog it makes, handed to the UAS (``dialog.py``) once answered (RFC 3261 §13.2, §17.1.1, §9.1).

Inputs: ``invite(invitation, now_ms)``, ``receive_response(response, source, now_ms)`` (every SIP response that came
to the listener: the ones that are not ours are left alone, ``False``), ``cancel(call_id, now_ms)``, ``tick``.
Outputs, drained after every input: ``datagrams_to_send()``, ``events()``; sleep until ``next_deadline_ms()``.

Rules:

- The INVITE carries our SDP offer (PCMU, PCMA, telephone-event: ``sdp.offer``) and goes to the next hop the caller
  resolved (the outbound proxy, as a loose ``Route``, or the trunk). Over UDP it is retransmitted at T1, 2·T1, 4·T1 …
  (Timer A) until any response; none by 64·T1 (Timer B): ``DialEnded(408, cause="timeout")``.
- 1xx: the retransmissions stop; each 180 and 183 is told (``Provisional``), a 183's SDP kept as the early answer.
  No ``100rel``: we neither require nor support it, so no reliable provisional response is sent to us.
- 401 / 407: ACKed, and the INVITE sent again (CSeq + 1, a new branch, the same Call-ID and From tag) with digest
  credentials, once per nonce: a challenge repeating a nonce already answered, or none we can answer, ends the dial
  (``cause="auth_rejected"``).
- Any other final non-2xx: ACKed on the INVITE's branch (again for each retransmission of it), and the dial ends
  with its status (``cause="rejected"``; a 487 after our CANCEL: ``canceled`` or ``ring_timeout``).
- 2xx: ACKed end to end (a new branch, to the 2xx's Contact, through its Record-Route set reversed); the answer is
  the 2xx's SDP, else the 183's. ``DialAnswered`` carries the confirmed ``Dialog`` for ``SipUas.adopt``: every later
  request in it (BYE either way, re-INVITE, INFO, REFER) is the UAS's. A retransmitted 2xx is ACKed again for 64·T1;
  a 2xx from another fork (another To tag) is ACKed and ended with a BYE (§13.2.2.4).
- ``cancel`` (the application's, or the ring timeout's: ``Invitation.ring_timeout_ms`` from the INVITE): a CANCEL
  once a provisional response has come (§9.1: not before), retransmitted (Timer E); the INVITE then ends with the
  487 — or, when none comes within 64·T1 of the CANCEL, by itself. A 2xx that crosses the CANCEL is a call all the
  same: ``DialAnswered(canceled=True)``, for the caller to end with a BYE.
"""

from __future__ import annotations

import enum
import ipaddress
import secrets
from dataclasses import dataclass, field
from typing import Final, Literal

from callbridge.codecs import AudioEncoding
from callbridge.sip.dialog_state import Dialog, DialogState
from callbridge.sip.digest import authorization, best_challenge
from callbridge.sip.invite_offer import placeholder_choice
from callbridge.sip.message import (
    SipRequest,
    SipResponse,
    header_param,
    host_port,
    transport_param,
    uri_of,
    via_sent_by,
)
from callbridge.sip.sdp import DEFAULT_CODECS, MediaChoice, SdpError, read_answer
from callbridge.sip.transaction import TIMEOUT_MS, Address, Due, Outgoing, Retransmission, TxKind, retransmission_of

__all__ = ["DialAnswered", "DialEnded", "DialEndCause", "Invitation", "Provisional", "SipUac", "UacConfig", "UacEvent"]

_ALLOW: Final = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, NOTIFY"
_TRIED_NONCES: Final = 8

DialEndCause = Literal["rejected", "timeout", "ring_timeout", "canceled", "auth_rejected"]
"""Why a dial ended unanswered: a final response from the far end or the trunk (its status says which); no response
at all (Timer B); our CANCEL at the ring timeout, or the caller's; credentials refused or none to give."""


@dataclass(frozen=True, slots=True)
class UacConfig:
    host: str
    """The address we advertise (Via, Contact, the SDP's ``c=`` is the caller's)."""
    port: int
    user_agent: str = "callbridge"
    username: str | None = None
    password: str | None = None
    """Digest credentials for the trunk's 401 / 407; None: a challenge ends the dial."""
    tls_port: int | None = None
    """Our TLS listener's port, where there is one: a dial over TLS advertises it (Via, Contact)."""
    codecs: tuple[AudioEncoding, ...] = DEFAULT_CODECS
    """What our offer lists (``sip.codecs``): an answer that took another is not one to it."""

    def host_port(self, transport: str) -> str:
        """Our ``host:port`` for a request on ``transport``."""
        return host_port(self.host, self.tls_port if transport == "TLS" and self.tls_port is not None else self.port)


@dataclass(frozen=True, slots=True)
class Invitation:
    """One call to place."""

    call_id: str
    request_uri: str
    """``sip:+15551230000@trunk.example.com``."""
    from_uri: str
    """Who calls: ``sip:+15559870000@trunk.example.com``."""
    destination: Address
    """The next hop, resolved: the outbound proxy, or the trunk."""
    offer: str
    """Our SDP offer (``sdp.offer``), with the RTP port already bound."""
    rtp_host: str
    rtp_port: int
    session_id: int
    ring_timeout_ms: int
    """Unanswered this long from the INVITE: our CANCEL (``cause="ring_timeout"``)."""
    transport: str = "UDP"
    route: tuple[str, ...] = ()
    """``Route`` values (an outbound proxy: ``<sip:proxy;lr>``)."""
    extra_headers: tuple[tuple[str, str], ...] = ()
    srtp_key: bytes | None = None
    """Our SRTP key where the offer is SRTP (``sdp.offer(srtp_key=…)``): the answer must take it in kind."""


@dataclass(frozen=True, slots=True)
class Provisional:
    """A 180 or 183 (each status once): ringing, or early media (``early``: the 183's SDP answer)."""

    call_id: str
    status: int
    early: MediaChoice | None


@dataclass(frozen=True, slots=True)
class DialAnswered:
    """The far end answered: the dialog (confirmed, ACK sent) for ``SipUas.adopt``; ``choice`` None when no usable
    answer came (end it with a BYE); ``canceled``: the 2xx crossed our CANCEL (end it too)."""

    call_id: str
    dialog: Dialog
    choice: MediaChoice | None
    canceled: bool


@dataclass(frozen=True, slots=True)
class DialEnded:
    """The dial ended unanswered: ``status`` the final response's (408 when there was none), ``reason`` its phrase."""

    call_id: str
    status: int
    reason: str
    cause: DialEndCause


UacEvent = Provisional | DialAnswered | DialEnded


class _Stage(enum.Enum):
    CALLING = "calling"
    """INVITE out, no response yet."""
    PROCEEDING = "proceeding"
    """A provisional response came."""
    DONE = "done"
    """Answered or ended; kept 64·T1 to ACK retransmitted finals."""


@dataclass(slots=True)
class _Dial:
    invitation: Invitation
    from_tag: str
    invited_at_ms: int
    cseq: int = 1
    branch: str = ""
    stage: _Stage = _Stage.CALLING
    retransmit: Retransmission | None = None
    """The INVITE's Timer A/B; None once a response came."""
    cancel_cause: DialEndCause | None = None
    """Why we cancel (asked before any provisional: sent when one comes)."""
    cancel: Retransmission | None = None
    cancel_deadline_ms: int | None = None
    early: MediaChoice | None = None
    told: set[int] = field(default_factory=set)
    answered_tag: str | None = None
    ack: Outgoing | None = None
    """The ACK of our 2xx, sent again for its retransmissions."""
    done_at_ms: int = 0
    tried_nonces: list[str] = field(default_factory=list)


class SipUac:
    """The INVITEs of the calls we place. See the module docstring."""

    def __init__(self, config: UacConfig) -> None:
        self.config = config
        self._dials: dict[str, _Dial] = {}
        self._out: list[Outgoing] = []
        self._events: list[UacEvent] = []

    # ------------------------------------------------------------------ outputs

    def datagrams_to_send(self) -> list[Outgoing]:
        out, self._out = self._out, []
        return out

    def events(self) -> list[UacEvent]:
        events, self._events = self._events, []
        return events

    def next_deadline_ms(self) -> int | None:
        deadlines: list[int] = []
        for dial in self._dials.values():
            if dial.stage is _Stage.DONE:
                deadlines.append(dial.done_at_ms + TIMEOUT_MS)
                continue
            deadlines.extend(r.deadline_ms for r in (dial.retransmit, dial.cancel) if r is not None)
            if dial.cancel_deadline_ms is not None:
                deadlines.append(dial.cancel_deadline_ms)
            elif dial.cancel_cause is None:
                deadlines.append(dial.invited_at_ms + dial.invitation.ring_timeout_ms)
        return min(deadlines) if deadlines else None

    def awaits(self, source: Address) -> bool:
        """A dial of ours went to ``source`` (and is not forgotten): a datagram from anywhere else is not read here
        (it goes to the UAS, behind its flood budgets)."""
        return any(dial.invitation.destination == source for dial in self._dials.values())

    def dialling(self, call_id: str) -> bool:
        """A dial of ours not answered or ended yet."""
        dial = self._dials.get(call_id)
        return dial is not None and dial.stage is not _Stage.DONE

    # ------------------------------------------------------------------- inputs

    def invite(self, invitation: Invitation, now_ms: int) -> None:
        """Place the call: the INVITE goes now."""
        if invitation.call_id in self._dials:
            raise ValueError(f"a dial with Call-ID {invitation.call_id} exists")
        dial = self._dials[invitation.call_id] = _Dial(invitation, secrets.token_hex(6), now_ms)
        self._send_invite(dial, now_ms, [])

    def cancel(self, call_id: str, now_ms: int, cause: DialEndCause = "canceled") -> None:
        """Give up on a dial still ringing: a CANCEL now, or once a provisional response comes (§9.1)."""
        dial = self._dials.get(call_id)
        if dial is None or dial.stage is _Stage.DONE or dial.cancel_cause is not None:
            return
        dial.cancel_cause = cause
        if dial.stage is _Stage.PROCEEDING:
            self._send_cancel(dial, now_ms)

    def receive_response(self, response: SipResponse, source: Address, now_ms: int) -> bool:
        """A response; True when it was ours (an INVITE's or a CANCEL's of a dial we know)."""
        dial = self._dials.get(response.call_id)
        number, method = response.cseq
        if dial is None or method not in ("INVITE", "CANCEL"):
            return False
        if method == "CANCEL" or number != dial.cseq or response.branch != dial.branch:
            if method == "CANCEL" and response.status >= 200:
                dial.cancel = None
            return True  # the CANCEL's own answer, or one to an INVITE we sent again with credentials
        if response.status < 200:
            self._provisional(dial, response, now_ms)
        elif response.status < 300:
            self._answered(dial, response, now_ms)
        else:
            self._refused(dial, response, now_ms)
        return True

    def tick(self, now_ms: int) -> None:
        """Retransmit what is due; Timer B, the ring timeout, a CANCEL unanswered; forget finished dials."""
        for dial in list(self._dials.values()):
            if dial.stage is _Stage.DONE:
                if dial.done_at_ms + TIMEOUT_MS <= now_ms:
                    del self._dials[dial.invitation.call_id]
                continue
            if dial.retransmit is not None:
                due = dial.retransmit.due(now_ms)
                if due is Due.GIVE_UP:
                    self._end(dial, 408, "no response from the trunk", "timeout", now_ms)
                    continue
                if due is Due.RESEND:
                    self._resend(dial.retransmit, now_ms)
            if dial.cancel is not None:
                due = dial.cancel.due(now_ms)
                if due is Due.RESEND:
                    self._resend(dial.cancel, now_ms)
                elif due is Due.GIVE_UP:
                    dial.cancel = None
            if dial.cancel_deadline_ms is not None and dial.cancel_deadline_ms <= now_ms:
                assert dial.cancel_cause is not None
                self._end(dial, 487, "no final response after our CANCEL", dial.cancel_cause, now_ms)
            elif dial.cancel_cause is None and dial.invited_at_ms + dial.invitation.ring_timeout_ms <= now_ms:
                self.cancel(dial.invitation.call_id, now_ms, "ring_timeout")

    # --------------------------------------------------------------- responses

    def _provisional(self, dial: _Dial, response: SipResponse, now_ms: int) -> None:
        if dial.stage is _Stage.DONE:
            return
        dial.retransmit = None  # §17.1.1.2: any provisional response stops Timer A and Timer B
        dial.stage = _Stage.PROCEEDING
        if response.body and response.media_type == "application/sdp" and dial.early is None:
            dial.early = _answer_in(response, self.config.codecs, dial.invitation.srtp_key)
        if response.status in (180, 183) and response.status not in dial.told:
            dial.told.add(response.status)
            self._events.append(Provisional(dial.invitation.call_id, response.status, dial.early))
        if dial.cancel_cause is not None and dial.cancel is None and dial.cancel_deadline_ms is None:
            self._send_cancel(dial, now_ms)

    def _answered(self, dial: _Dial, response: SipResponse, now_ms: int) -> None:
        to_tag = header_param(response.header("To") or "", "tag") or ""
        if dial.stage is _Stage.DONE:
            if dial.answered_tag == to_tag and dial.ack is not None:
                self._out.append(dial.ack)  # our ACK was lost: the 2xx came again
            else:  # another fork answered too, or a 2xx after we gave up: ACK it and end it (§13.2.2.4)
                self._ack_and_bye(dial, response)
            return
        choice = _answer_in(response, self.config.codecs, dial.invitation.srtp_key)
        dialog = self._dialog(dial, response, choice)
        ack = self._in_dialog(dial, dialog, "ACK", dial.cseq)
        dial.ack = Outgoing(ack.serialize(), dialog.source, dial.invitation.transport)
        self._out.append(dial.ack)
        dial.answered_tag = to_tag
        canceled = dial.cancel_cause is not None
        self._done(dial, now_ms)
        self._events.append(DialAnswered(dial.invitation.call_id, dialog, choice or dial.early, canceled))

    def _refused(self, dial: _Dial, response: SipResponse, now_ms: int) -> None:
        self._out.append(self._ack_of_final(dial, response))  # each retransmission of it too (§17.1.1.3)
        if dial.stage is _Stage.DONE:
            return
        status = response.status
        if status in (401, 407) and dial.cancel_cause is None:
            credentials = self._credentials(dial, response)
            if credentials is not None:
                self._send_invite(dial, now_ms, [credentials])
                return
            self._end(dial, status, response.reason, "auth_rejected", now_ms)
            return
        cause: DialEndCause = dial.cancel_cause if status == 487 and dial.cancel_cause is not None else "rejected"
        self._end(dial, status, response.reason, cause, now_ms)

    def _credentials(self, dial: _Dial, response: SipResponse) -> tuple[str, str] | None:
        """The header answering a 401 / 407, or None: no credentials, no challenge we can answer, or one whose
        nonce we answered already (the credentials are wrong)."""
        config = self.config
        proxy = response.status == 407
        challenge = best_challenge(response.headers_all("Proxy-Authenticate" if proxy else "WWW-Authenticate"))
        if config.username is None or config.password is None or challenge is None or challenge.nonce in dial.tried_nonces:
            return None
        dial.tried_nonces = [*dial.tried_nonces[-(_TRIED_NONCES - 1) :], challenge.nonce]
        value = authorization(
            challenge, method="INVITE", uri=dial.invitation.request_uri, username=config.username, password=config.password,
            cnonce=secrets.token_hex(8), nonce_count=1,
        )  # fmt: skip
        return ("Proxy-Authorization" if proxy else "Authorization", value)

    # ----------------------------------------------------------------- requests

    def _send_invite(self, dial: _Dial, now_ms: int, credentials: list[tuple[str, str]]) -> None:
        invitation, config = dial.invitation, self.config
        if dial.branch:
            dial.cseq += 1
        dial.branch = "z9hG4bK" + secrets.token_hex(8)
        request = self._request(dial, "INVITE", dial.cseq)
        request.add("Contact", f"<sip:callbridge@{config.host_port(invitation.transport)}{transport_param(invitation.transport)}>")
        request.add("Allow", _ALLOW)
        for name, value in (*credentials, *invitation.extra_headers):
            request.add(name, value)
        request.add("Content-Type", "application/sdp")
        request.body = invitation.offer.encode()
        sent = Outgoing(request.serialize(), invitation.destination, invitation.transport)
        self._out.append(sent)
        dial.retransmit = retransmission_of(TxKind.INVITE, sent, now_ms, dial.cseq)
        dial.stage = _Stage.CALLING

    def _send_cancel(self, dial: _Dial, now_ms: int) -> None:
        """§9.1: the INVITE's Request-URI, Call-ID, From, To (no tag), CSeq number and Via branch; its Route."""
        sent = Outgoing(self._request(dial, "CANCEL", dial.cseq).serialize(), dial.invitation.destination, dial.invitation.transport)
        self._out.append(sent)
        dial.cancel = retransmission_of(TxKind.CANCEL, sent, now_ms, dial.cseq)
        dial.cancel_deadline_ms = now_ms + TIMEOUT_MS

    def _request(self, dial: _Dial, method: str, cseq: int, to_tag: str | None = None) -> SipRequest:
        """A request on the INVITE's transaction path: its Request-URI, Via branch, From, To and Route."""
        invitation, config = dial.invitation, self.config
        request = SipRequest(method=method, uri=invitation.request_uri)
        request.add("Via", f"SIP/2.0/{invitation.transport} {config.host_port(invitation.transport)};branch={dial.branch};rport")
        request.add("Max-Forwards", "70")
        request.add("From", f"<{invitation.from_uri}>;tag={dial.from_tag}")
        request.add("To", f"<{invitation.request_uri}>" + (f";tag={to_tag}" if to_tag else ""))
        request.add("Call-ID", invitation.call_id)
        request.add("CSeq", f"{cseq} {method}")
        for route in invitation.route:
            request.add("Route", route)
        request.add("User-Agent", config.user_agent)
        return request

    def _ack_of_final(self, dial: _Dial, response: SipResponse) -> Outgoing:
        """The ACK of a non-2xx final response: hop by hop, on the INVITE's branch, its To (with the tag)."""
        ack = self._request(dial, "ACK", response.cseq[0], header_param(response.header("To") or "", "tag"))
        return Outgoing(ack.serialize(), dial.invitation.destination, dial.invitation.transport)

    def _in_dialog(self, dial: _Dial, dialog: Dialog, method: str, cseq: int) -> SipRequest:
        """A request in the dialog a 2xx made (the ACK; a BYE to a stray fork): a new branch, to the remote target,
        through the route set (§12.2.1.1)."""
        mirror = dialog.invite
        request = SipRequest(method=method, uri=uri_of(mirror.header("Contact") or "") or dial.invitation.request_uri)
        request.add("Via", f"SIP/2.0/{dial.invitation.transport} {self.config.host_port(dial.invitation.transport)};branch=z9hG4bK{secrets.token_hex(8)};rport")
        request.add("Max-Forwards", "70")
        request.add("From", mirror.header("To") or "")
        request.add("To", mirror.header("From") or "")
        request.add("Call-ID", dial.invitation.call_id)
        request.add("CSeq", f"{cseq} {method}")
        for route in mirror.headers_all("Record-Route"):
            request.add("Route", route)
        request.add("User-Agent", self.config.user_agent)
        return request

    def _ack_and_bye(self, dial: _Dial, response: SipResponse) -> None:
        dialog = self._dialog(dial, response, None)  # only to address the ACK and BYE: its media is never used
        for method in ("ACK", "BYE"):
            request = self._in_dialog(dial, dialog, method, dial.cseq if method == "ACK" else dial.cseq + 1)
            self._out.append(Outgoing(request.serialize(), dialog.source, dial.invitation.transport))

    def _dialog(self, dial: _Dial, response: SipResponse, choice: MediaChoice | None) -> Dialog:
        """The dialog a 2xx makes, in the form ``SipUas`` keeps its own: ``invite`` is the INVITE as the far end
        would have sent it (its To in From, our From in To, its Contact, the route set as Record-Route), so that
        the UAS writes and matches every later request in it as in a dialog it answered. ``choice``: the 2xx's
        answer, read once by the caller (else the 183's, else a placeholder)."""
        invitation = dial.invitation
        mirror = SipRequest(method="INVITE", uri=invitation.request_uri, transport=invitation.transport)
        mirror.add("From", response.header("To") or "")
        mirror.add("To", f"<{invitation.from_uri}>;tag={dial.from_tag}")
        mirror.add("Call-ID", invitation.call_id)
        mirror.add("CSeq", "0 INVITE")
        if (remote_target := response.header("Contact")) is not None:
            mirror.add("Contact", remote_target)
        record_route = response.headers_all("Record-Route")
        for route in reversed(record_route):  # §12.1.2: the UAC's route set is the Record-Route reversed
            mirror.add("Record-Route", route)
        return Dialog(
            call_id=invitation.call_id, state=DialogState.CONFIRMED, invite=mirror, source=self._next_hop(dial, record_route, remote_target),
            local_tag=dial.from_tag, remote_cseq=0, choice=choice or dial.early or placeholder_choice(dial.invitation.destination), invite_branch=dial.branch,
            local_cseq=dial.cseq, sdp_host=invitation.rtp_host, rtp_port=invitation.rtp_port, session_id=invitation.session_id,
            sdp_version=invitation.session_id, sdp=invitation.offer,
        )  # fmt: skip

    def _next_hop(self, dial: _Dial, record_route: list[str], remote_target: str | None) -> Address:
        """Where requests in the dialog go: through the proxy or the route set, as the INVITE went; with neither,
        to the remote target itself when it is an address we can reach without a lookup."""
        if dial.invitation.route or record_route or remote_target is None:
            return dial.invitation.destination
        hostport = uri_of(remote_target).partition("@")[2] or uri_of(remote_target).partition(":")[2]
        host, port = via_sent_by(hostport.split(";")[0])
        return (host, port) if _is_address(host) else dial.invitation.destination

    # ------------------------------------------------------------------ helpers

    def _end(self, dial: _Dial, status: int, reason: str, cause: DialEndCause, now_ms: int) -> None:
        self._done(dial, now_ms)
        self._events.append(DialEnded(dial.invitation.call_id, status, reason, cause))

    def _done(self, dial: _Dial, now_ms: int) -> None:
        dial.stage = _Stage.DONE
        dial.done_at_ms = now_ms
        dial.retransmit = None
        dial.cancel = None
        dial.cancel_deadline_ms = None

    def _resend(self, retransmit: Retransmission, now_ms: int) -> None:
        if retransmit.resend(now_ms):
            self._out.append(Outgoing(retransmit.data, retransmit.address, retransmit.transport))


def _answer_in(response: SipResponse, codecs: tuple[AudioEncoding, ...], srtp_key: bytes | None) -> MediaChoice | None:
    """The SDP answer a response carries to our offer; None: none, or not one to our offer."""
    if not response.body or response.media_type != "application/sdp":
        return None
    try:
        return read_answer(response.body.decode("utf-8", "replace"), codecs, srtp_key)
    except SdpError:
        return None


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True

