"""The SIP user-agent server, sans-I/O: datagrams and a clock in; datagrams, call events and a deadline out
(RFC 3261; telephony-protocols.md §5.1).

Inputs: ``receive_datagram(data, source, now_ms)``, the server's answers to a
``CallOffered`` (``accept`` / ``reject``), ``hang_up`` (our BYE), ``tick``.
Outputs, drained after every input: ``datagrams_to_send()``, ``events()``;
sleep until ``next_deadline_ms()``.

What it does:

- INVITE: admission (source address in ``allowed_networks``, else digest
  authentication when credentials are set: 401 with a nonce; else 403),
  ``Require`` with an option we lack → 420 + ``Unsupported``, a body that is
  not SDP → 415 + ``Accept``, no audio stream we take → 488; otherwise
  ``100 Trying`` at once and ``CallOffered`` for the server, which accepts
  (200 + SDP answer) or rejects (486, 503, …). A retransmitted INVITE gets the
  last response again.
- The 200 is retransmitted at T1, 2·T1, … capped at T2 until the ACK
  (§13.3.1.4); no ACK by 64·T1: BYE and ``CallEnded("no_ack")``. A non-2xx
  final response is retransmitted until its ACK (same branch) or 64·T1.
- CANCEL → 200, and 487 to the INVITE if it had no final response
  (``CallEnded("cancelled")``); no such transaction → 481.
- BYE → 200 and ``CallEnded("bye")``; ours (``hang_up``) is retransmitted
  (Timer E) until a response or 64·T1.
- An INVITE without SDP (a delayed offer, §13.2.1): the 200 carries our
  offer (PCMU, PCMA, telephone-event), the ACK must carry the answer:
  ``OfferAnswered``, or — none, or not an answer to our offer — our BYE and
  ``CallEnded("bad_answer")``.
- re-INVITE (hold/resume, a new address): answered from the same codec,
  ``o=`` version bumped only when our answer changes, ``MediaChanged``; an
  offer we cannot take → 488, the call goes on. An empty re-INVITE gets our
  current SDP as the offer (the answer in the ACK is not read).
- 100rel (RFC 3262): an INVITE with ``Require: 100rel`` gets its 180 (``ring``)
  reliably, with ``RSeq``, retransmitted until the PRACK whose ``RAck``
  names it (→ 200; any other PRACK → 481); no PRACK by 64·T1 → 504. Any other
  ``Require`` still gets 420.
- OPTIONS → 200 with ``Allow``/``Accept``/``Supported``, in or out of a
  dialog; INFO (``application/dtmf-relay``) → 200 and ``DtmfInfo``.
- Transfer (``transfer``, RFC 3515): REFER in the dialog with ``Refer-To``,
  retransmitted (Timer E) until a response; a final non-2xx →
  ``TransferResult`` failed. After a 2xx (202 Accepted) the peer reports in
  NOTIFYs (``Event: refer``, ``message/sipfrag``), each answered 200: the
  first final status line decides (2xx: done; else failed), as does a
  subscription terminated without one, or no final NOTIFY within 64·T1.
  Ending the call after a successful transfer (our BYE) is the server's.
- Unknown dialog → 481; a method we know but do not do → 405 + ``Allow``; one
  we do not know → 501; a malformed request with enough headers to answer →
  400; anything else is dropped (``Dropped``, counted by the server).

Responses go where RFC 3581 says: to the source address when the top Via
has ``rport``, else to the source IP and the Via's port; the top Via gets
``received``/``rport``. Requests we send (BYE) go to the address the INVITE
came from, with the Record-Route set as ``Route``.
"""

from __future__ import annotations

import secrets
from collections import deque
from typing import Final

from callbridge.codecs import AudioEncoding
from callbridge.sip import digest
from callbridge.sip.dialog_state import (
    TRANSITIONS,
    CallConfirmed,
    CallEnded,
    CallOffered,
    Dialog,
    DialogState,
    DialogStateError,
    Dropped,
    DtmfInfo,
    MediaChanged,
    OfferAnswered,
    SipEvent,
    TransferResult,
    Trigger,
    UasConfig,
)
from callbridge.sip.message import (
    REASON_PHRASES,
    SipParseError,
    SipParseReason,
    SipRequest,
    SipResponse,
    display_name_of,
    header_param,
    host_port,
    parse_message,
    server_transaction_key,
    split_params,
    uri_of,
    via_sent_by,
    with_param,
)
from callbridge.sip.rate_limit import SourceBudgets
from callbridge.sip.refer import Transfer, TransferOutcome, notify_status, refer_to
from callbridge.sip.sdp import Direction, MediaChoice, SdpError, answer, choose, offer, read_answer
from callbridge.sip.transaction import TIMEOUT_MS, Address, Due, Outgoing, Retransmission, TxKind, retransmission_of
from callbridge.sources import source_allowed

__all__ = [
    "ALLOW",
    "CallConfirmed",
    "CallEnded",
    "CallOffered",
    "DialogState",
    "Dropped",
    "DtmfInfo",
    "MediaChanged",
    "OfferAnswered",
    "SipEvent",
    "SipUas",
    "TransferResult",
    "UasConfig",
]

ALLOW: Final = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, NOTIFY, PRACK"
_KNOWN_UNSUPPORTED: Final = frozenset({"REGISTER", "SUBSCRIBE", "MESSAGE", "UPDATE", "REFER", "PUBLISH"})
_SUPPORTED: Final[frozenset[str]] = frozenset({"100rel"})  # Require of anything else → 420
_MAX_NONCES: Final = 1024

class SipUas:
    """Every SIP dialog of one listener. See the module docstring."""

    def __init__(self, config: UasConfig) -> None:
        self.config = config
        self._budgets = SourceBudgets(config.source_requests_per_s, config.requests_per_s)
        self.dialogs: dict[str, Dialog] = {}
        self._out: list[Outgoing] = []
        self._events: list[SipEvent] = []
        self._cache: dict[tuple[str, str], tuple[Outgoing, int]] = {}
        """(transaction key, method) → the last response sent and when it may be forgotten (retransmitted requests).
        In the order they expire (each is kept ``TIMEOUT_MS`` from its response): the first is the next to go, so
        neither the deadline nor the pruning reads more than the entries due (a flood fills it by thousands)."""
        self._invite_branches: dict[str, str] = {}
        """INVITE transaction key → call id (CANCEL matching, ACK of a non-2xx)."""
        self._nonces: deque[str] = deque(maxlen=_MAX_NONCES)
        self._final_retransmits: dict[str, Retransmission] = {}
        """INVITE transaction key → a non-2xx final response retransmitted until its ACK."""

    # ------------------------------------------------------------------ outputs

    def datagrams_to_send(self) -> list[Outgoing]:
        out, self._out = self._out, []
        return out

    def events(self) -> list[SipEvent]:
        events, self._events = self._events, []
        return events

    def next_deadline_ms(self) -> int | None:
        deadlines = [r.deadline_ms for d in self.dialogs.values() for r in d.retransmits]
        deadlines.extend(r.deadline_ms for r in self._final_retransmits.values())
        if self._cache:
            deadlines.append(next(iter(self._cache.values()))[1])
        deadlines.extend(d.ended_at_ms + TIMEOUT_MS for d in self.dialogs.values() if d.ended_at_ms is not None)
        deadlines.extend(d.transfer.deadline_ms for d in self.dialogs.values() if d.transfer is not None)
        return min(deadlines) if deadlines else None

    # ------------------------------------------------------------------- inputs

    def receive_datagram(self, data: bytes, source: Address, now_ms: int, *, transport: str = "UDP") -> None:
        """One UDP datagram (or one message cut from a TCP stream: ``transport="TCP"``) from ``source``. Drain
        ``datagrams_to_send`` and ``events`` next."""
        refused = self._budgets.take(source[0], now_ms)
        if refused is not None:  # a flood: dropped before it costs a parse (``rate_limit``)
            self._events.append(Dropped(refused, source))
            return
        if not data.strip(b"\r\n"):
            return  # keep-alive CRLF (RFC 5626 §3.5.1)
        try:
            message = parse_message(data)
        except SipParseError as exc:
            self._events.append(Dropped(f"malformed:{exc.reason.value}", source))
            if exc.request is not None:
                exc.request.transport = transport
            if exc.request is not None and exc.request.method != "ACK":
                if exc.reason is SipParseReason.HEAD_TOO_LARGE:
                    self._respond(exc.request, source, 513, now_ms, reason="Message Too Large")
                else:
                    self._respond(exc.request, source, 400, now_ms, reason=f"Bad Request ({exc.reason.value})")
            return
        if isinstance(message, SipResponse):
            self._on_response(message, source, now_ms)
        else:
            message.transport = transport
            self._on_request(message, source, now_ms)

    def accept(self, call_id: str, sdp_host: str, rtp_port: int, now_ms: int) -> None:
        """Answer an offered call: 200 with our SDP (``sdp_host``:``rtp_port``), retransmitted until the ACK."""
        dialog = self.dialogs[call_id]
        self._transition(dialog, Trigger.ACCEPT)
        dialog.sdp_host, dialog.rtp_port = sdp_host, rtp_port
        dialog.session_id = secrets.randbelow(2**31)
        dialog.sdp_version = dialog.session_id
        if dialog.delayed_offer:
            dialog.sdp = offer(host=sdp_host, port=rtp_port, session_id=dialog.session_id, version=dialog.sdp_version)
        else:
            dialog.sdp = answer(dialog.choice, host=sdp_host, port=rtp_port, session_id=dialog.session_id, version=dialog.sdp_version)
        # RFC 3262 §3: our 180 has no SDP, so the 200 need not wait for its PRACK; the 180 stops, a late PRACK
        # still gets its 200
        dialog.retransmits = [r for r in dialog.retransmits if r.kind is not TxKind.RELIABLE_1XX]
        self._answer_invite(dialog, dialog.invite, now_ms)

    def ring(self, call_id: str, now_ms: int) -> None:
        """``180 Ringing`` for an offered call (the server answers after ``sip.answer_delay_ms``). Reliable when
        the INVITE required ``100rel`` (RFC 3262 §3): ``RSeq``, retransmitted at T1, 2·T1, 4·T1 … until its
        PRACK; none by 64·T1 → 504 to the INVITE and ``CallEnded("no_prack")``."""
        dialog = self.dialogs.get(call_id)
        if dialog is None or dialog.state is not DialogState.OFFERED or dialog.unacked_rseq is not None:
            return  # §3: no second reliable provisional response before the first is acknowledged
        extra = [("Contact", self._contact(dialog.invite))]
        extra.extend(("Record-Route", value) for value in dialog.invite.headers_all("Record-Route"))
        if dialog.reliable_provisional:
            dialog.rseq = dialog.rseq + 1 if dialog.rseq else 1 + secrets.randbelow(2**31 - 1)  # §3: 1 … 2**31 − 1
            dialog.unacked_rseq = dialog.rseq
            extra += [("Require", "100rel"), ("RSeq", str(dialog.rseq))]
        sent = self._respond(dialog.invite, dialog.source, 180, now_ms, to_tag=dialog.local_tag, extra=extra)
        if dialog.reliable_provisional:
            dialog.retransmits.append(retransmission_of(TxKind.RELIABLE_1XX, sent, now_ms, dialog.rseq))

    def reject(
        self, call_id: str, status: int, now_ms: int, *, retry_after_s: int | None = None, redirect_to: str | None = None
    ) -> None:
        """Refuse an offered call (486 busy, 503 draining, 480 …), or send it on (``redirect_to``: ``302 Moved
        Temporarily`` with it as the Contact; a bare number at the trunk, as a REFER's)."""
        dialog = self.dialogs.get(call_id)
        if dialog is None or dialog.state is not DialogState.OFFERED:
            return
        self._transition(dialog, Trigger.REJECT)
        extra = [("Retry-After", str(retry_after_s))] if retry_after_s is not None else []
        if redirect_to is not None:
            extra.append(("Contact", f"<{refer_to(redirect_to, host_port(*dialog.source))}>"))
        self._final(dialog.invite, dialog.source, status, now_ms, to_tag=dialog.local_tag, extra=extra)
        self._end(dialog, "redirected" if redirect_to is not None else "rejected", now_ms, announce=False)

    def hang_up(self, call_id: str, now_ms: int) -> None:
        """End the call from our side: BYE (after the ACK if it has not come yet); 480 if not answered yet."""
        dialog = self.dialogs.get(call_id)
        if dialog is None:
            return
        if dialog.state is DialogState.OFFERED:
            self.reject(call_id, 480, now_ms)
        elif dialog.state is DialogState.ANSWERED:
            dialog.bye_after_ack = True
        elif dialog.state is DialogState.CONFIRMED:
            self._send_bye(dialog, now_ms)

    def transfer(self, call_id: str, target: str, now_ms: int) -> None:
        """Transfer a confirmed call (RFC 3515): REFER with ``Refer-To: target`` (a SIP or tel URI; a bare number
        goes to the trunk, ``sip:<number>@<trunk host>``). Its outcome comes as ``TransferResult``."""
        dialog = self.dialogs.get(call_id)
        if dialog is None or dialog.state is not DialogState.CONFIRMED or dialog.transfer is not None:
            why = "a transfer is in progress" if dialog is not None and dialog.transfer is not None else "the call is not established"
            self._events.append(TransferResult(call_id, False, 0, why))
            return
        request = self._in_dialog_request(dialog, "REFER")
        request.add("Refer-To", f"<{refer_to(target, host_port(*dialog.source))}>")
        request.add("Referred-By", f"<sip:callbridge@{host_port(self.config.host, self.config.port)}>")
        request.add("Contact", self._contact(dialog.invite))
        sent = Outgoing(request.serialize(), dialog.source, dialog.invite.transport)
        self._out.append(sent)
        dialog.transfer = Transfer(dialog.local_cseq, now_ms + TIMEOUT_MS)
        dialog.retransmits.append(retransmission_of(TxKind.REFER, sent, now_ms, dialog.local_cseq))

    def tick(self, now_ms: int) -> None:
        """Retransmit what is due, give up on what timed out, forget old transactions."""
        while self._cache:
            key, (_, until) = next(iter(self._cache.items()))
            if until > now_ms:
                break
            del self._cache[key]
        for branch, retransmit in list(self._final_retransmits.items()):
            due = retransmit.due(now_ms)
            if due is Due.GIVE_UP:
                del self._final_retransmits[branch]
                self._invite_branches.pop(branch, None)
            elif due is Due.RESEND:
                self._resend(retransmit, now_ms)
        for dialog in list(self.dialogs.values()):
            if dialog.ended_at_ms is not None and dialog.ended_at_ms + TIMEOUT_MS <= now_ms:
                del self.dialogs[dialog.call_id]
                self._invite_branches.pop(dialog.invite_branch, None)
                continue
            if dialog.transfer is not None and (outcome := dialog.transfer.expired(now_ms)) is not None:
                self._transfer_ended(dialog, outcome)
            for retransmit in list(dialog.retransmits):
                due = retransmit.due(now_ms)
                if due is Due.GIVE_UP:
                    dialog.retransmits.remove(retransmit)
                    self._gave_up(dialog, retransmit, now_ms)
                elif due is Due.RESEND:
                    self._resend(retransmit, now_ms)

    # ---------------------------------------------------------------- requests

    def _on_request(self, request: SipRequest, source: Address, now_ms: int) -> None:
        cached = self._cache.get((server_transaction_key(request), request.method))
        if cached is not None and request.method != "ACK":
            self._out.append(cached[0])  # a retransmitted request
            return
        method = request.method
        if method == "INVITE":
            self._on_invite(request, source, now_ms)
        elif method == "ACK":
            self._on_ack(request, now_ms)
        elif method == "CANCEL":
            self._on_cancel(request, source, now_ms)
        elif method == "BYE":
            self._on_bye(request, source, now_ms)
        elif method == "OPTIONS":
            dialog = self._dialog_of(request)
            if header_param(request.header("To") or "", "tag") is not None and dialog is None:
                self._respond(request, source, 481, now_ms)
            else:
                self._respond(request, source, 200, now_ms, extra=self._capabilities())
        elif method == "INFO":
            self._on_info(request, source, now_ms)
        elif method == "NOTIFY":
            self._on_notify(request, source, now_ms)
        elif method == "PRACK":
            self._on_prack(request, source, now_ms)
        elif method in _KNOWN_UNSUPPORTED:
            self._respond(request, source, 405, now_ms, extra=[("Allow", ALLOW)])
        else:
            self._respond(request, source, 501, now_ms, extra=[("Allow", ALLOW)])

    def _on_invite(self, request: SipRequest, source: Address, now_ms: int) -> None:
        if header_param(request.header("To") or "", "tag") is not None:
            dialog = self._dialog_of(request)
            if dialog is None or dialog.state is DialogState.ENDED:
                self._respond(request, source, 481, now_ms)
            else:
                self._on_reinvite(dialog, request, source, now_ms)
            return
        if request.call_id in self.dialogs:
            existing = self.dialogs[request.call_id]
            if existing.invite_branch != server_transaction_key(request):
                self._respond(request, source, 482, now_ms)  # the same call again on another path
            return
        refusal = self._admission(request, source)
        if refusal is not None:
            status, extra = refusal
            self._final(request, source, status, now_ms, extra=extra)
            return
        unsupported = [opt for opt in (request.headers_all("Require") + request.headers_all("Proxy-Require")) if opt.lower() not in _SUPPORTED]
        if unsupported:
            self._final(request, source, 420, now_ms, extra=[("Unsupported", ", ".join(unsupported))])
            return
        content_type = (request.header("Content-Type") or "").split(";")[0].strip().lower()
        if request.body and content_type != "application/sdp":
            self._final(request, source, 415, now_ms, extra=[("Accept", "application/sdp")])
            return
        try:
            choice = choose(request.body.decode("utf-8", "replace")) if request.body else _placeholder(source)
        except SdpError as exc:
            self._final(request, source, 400, now_ms, reason=f"Bad Request (SDP: {exc})")
            return
        if choice is None:  # nothing we take
            self._final(request, source, 488, now_ms, extra=[("Warning", '304 callbridge "PCMU or PCMA audio required"')])
            return
        dialog = Dialog(
            call_id=request.call_id,
            state=DialogState.OFFERED,
            invite=request,
            source=source,
            local_tag=secrets.token_hex(6),
            remote_cseq=request.cseq[0],
            choice=choice,
            invite_branch=server_transaction_key(request),
            delayed_offer=not request.body,
            reliable_provisional="100rel" in [opt.lower() for opt in request.headers_all("Require")],
        )
        self.dialogs[dialog.call_id] = dialog
        self._invite_branches[server_transaction_key(request)] = dialog.call_id
        self._respond(request, source, 100, now_ms)
        sender = request.header("From") or ""
        caller, callee = uri_of(sender), uri_of(request.header("To") or "")
        extension = tuple((name, value) for name, value in request.headers if name.lower().startswith("x-"))
        self._events.append(
            CallOffered(dialog.call_id, source, choice, caller, callee, dialog.delayed_offer, display_name_of(sender), extension)
        )

    def _on_reinvite(self, dialog: Dialog, request: SipRequest, source: Address, now_ms: int) -> None:
        cseq = request.cseq[0]
        if cseq <= dialog.remote_cseq or dialog.state not in (DialogState.ANSWERED, DialogState.CONFIRMED):
            self._final(request, source, 500, now_ms, to_tag=dialog.local_tag, extra=[("Retry-After", "1")])
            return
        dialog.remote_cseq = cseq
        if request.body:
            try:
                choice = choose(request.body.decode("utf-8", "replace"))
            except SdpError:
                choice = None
            if choice is None or choice.encoding is not dialog.choice.encoding:
                self._final(request, source, 488, now_ms, to_tag=dialog.local_tag)
                return
            changed = (choice.direction, choice.remote_host, choice.remote_port, choice.payload_type, choice.dtmf_payload_type) != (
                dialog.choice.direction,
                dialog.choice.remote_host,
                dialog.choice.remote_port,
                dialog.choice.payload_type,
                dialog.choice.dtmf_payload_type,
            )
            dialog.choice = choice
            sdp = answer(choice, host=dialog.sdp_host, port=dialog.rtp_port, session_id=dialog.session_id, version=dialog.sdp_version)
            if sdp != dialog.sdp:  # our SDP changes: its version goes up by one (RFC 3264 §8)
                dialog.sdp_version += 1
                sdp = answer(choice, host=dialog.sdp_host, port=dialog.rtp_port, session_id=dialog.session_id, version=dialog.sdp_version)
            dialog.sdp = sdp
            if changed:
                self._events.append(MediaChanged(dialog.call_id, choice))
        self._answer_invite(dialog, request, now_ms)

    def _on_ack(self, request: SipRequest, now_ms: int) -> None:
        retransmit = self._final_retransmits.pop(server_transaction_key(request), None)
        if retransmit is not None:  # ACK of a non-2xx final response: the transaction is done
            if request.call_id not in self.dialogs:  # a cancelled call's entry goes with its dialog
                self._invite_branches.pop(server_transaction_key(request), None)
            return
        dialog = self._dialog_of(request)
        if dialog is None:
            return
        cseq = request.cseq[0]
        acked = [r for r in dialog.retransmits if r.kind is TxKind.INVITE_2XX and r.cseq == cseq]
        for r in acked:
            dialog.retransmits.remove(r)
        if dialog.state is DialogState.ANSWERED:
            self._transition(dialog, Trigger.ACK)
            if dialog.delayed_offer and not self._take_answer(dialog, request, now_ms):
                return
            self._events.append(CallConfirmed(dialog.call_id))
            if dialog.bye_after_ack:
                self._send_bye(dialog, now_ms)

    def _take_answer(self, dialog: Dialog, ack: SipRequest, now_ms: int) -> bool:
        """The answer to our offer, in the ACK (RFC 3261 §13.2.1); none or one we cannot use: BYE (§13.3.1.4
        leaves no other way to end a confirmed dialog whose offer/answer failed)."""
        dialog.delayed_offer = False
        content_type = (ack.header("Content-Type") or "").split(";")[0].strip().lower()
        try:
            choice = read_answer(ack.body.decode("utf-8", "replace")) if ack.body and content_type == "application/sdp" else None
        except SdpError:
            choice = None
        if choice is None:
            self._send_bye(dialog, now_ms, "bad_answer")
            return False
        dialog.choice = choice  # ``dialog.sdp`` stays the offer we sent: a re-INVITE's answer bumps the version
        self._events.append(OfferAnswered(dialog.call_id, choice))
        return True

    def _on_cancel(self, request: SipRequest, source: Address, now_ms: int) -> None:
        call_id = self._invite_branches.get(server_transaction_key(request))
        dialog = self.dialogs.get(call_id) if call_id is not None else None
        if dialog is None:
            self._respond(request, source, 481, now_ms)
            return
        self._respond(request, source, 200, now_ms, to_tag=dialog.local_tag)
        if dialog.state is DialogState.OFFERED:
            self._transition(dialog, Trigger.CANCEL)
            self._final(dialog.invite, dialog.source, 487, now_ms, to_tag=dialog.local_tag)
            self._end(dialog, "cancelled", now_ms)

    def _on_bye(self, request: SipRequest, source: Address, now_ms: int) -> None:
        dialog = self._dialog_of(request)
        if dialog is None or dialog.state in (DialogState.ENDED, DialogState.OFFERED):
            self._respond(request, source, 481, now_ms)
            return
        self._respond(request, source, 200, now_ms, to_tag=dialog.local_tag)
        self._transition(dialog, Trigger.BYE_RECEIVED)
        self._end(dialog, "bye", now_ms)

    def _on_info(self, request: SipRequest, source: Address, now_ms: int) -> None:
        dialog = self._dialog_of(request)
        if dialog is None or dialog.state is DialogState.ENDED:
            self._respond(request, source, 481, now_ms)
            return
        self._respond(request, source, 200, now_ms, to_tag=dialog.local_tag)
        if (request.header("Content-Type") or "").lower().startswith("application/dtmf-relay"):
            for line in request.body.decode("utf-8", "replace").splitlines():
                key, _, value = line.partition("=")
                digit = value.strip().upper()
                if key.strip().lower() == "signal" and len(digit) == 1 and digit in "0123456789*#ABCD":
                    self._events.append(DtmfInfo(dialog.call_id, digit))

    def _on_prack(self, request: SipRequest, source: Address, now_ms: int) -> None:
        """RFC 3262 §3: a PRACK whose ``RAck`` names our reliable 180 (its RSeq, the INVITE's CSeq) → 200, and
        the 180 stops; anything else → 481. A body (an offer in the PRACK) is not read: our 180 carries none."""
        dialog = self._dialog_of(request)
        rack = (request.header("RAck") or "").split()
        if dialog is None or dialog.state is DialogState.ENDED or dialog.unacked_rseq is None or rack != [
            str(dialog.unacked_rseq), str(dialog.invite.cseq[0]), "INVITE"
        ]:
            self._respond(request, source, 481, now_ms)
            return
        dialog.unacked_rseq = None
        dialog.retransmits = [r for r in dialog.retransmits if r.kind is not TxKind.RELIABLE_1XX]
        self._respond(request, source, 200, now_ms, to_tag=dialog.local_tag)

    def _on_notify(self, request: SipRequest, source: Address, now_ms: int) -> None:
        """The progress of our REFER (RFC 3515 §2.4.4): a sipfrag status line; the first final one decides."""
        dialog = self._dialog_of(request)
        if dialog is None or dialog.state is DialogState.ENDED:
            self._respond(request, source, 481, now_ms)
            return
        status = notify_status(request.header("Event") or request.header("o") or "")
        self._respond(request, source, status, now_ms, to_tag=dialog.local_tag)
        transfer = dialog.transfer
        if status != 200 or transfer is None:
            return  # not about a REFER, or a late NOTIFY of a transfer already decided
        outcome = transfer.on_notify(request.body, request.header("Subscription-State") or "")
        if outcome is not None:
            self._transfer_ended(dialog, outcome)

    def _transfer_ended(self, dialog: Dialog, outcome: TransferOutcome) -> None:
        dialog.transfer = None
        dialog.retransmits = [r for r in dialog.retransmits if r.kind is not TxKind.REFER]
        self._events.append(TransferResult(dialog.call_id, outcome.ok, outcome.status, outcome.reason))

    def _admission(self, request: SipRequest, source: Address) -> tuple[int, list[tuple[str, str]]] | None:
        """None: admitted; else the refusal (401 with a challenge, or 403)."""
        if source_allowed(source[0], self.config.allowed_networks):
            return None
        config = self.config
        if config.username is None or config.password is None:
            return 403, []
        credentials = request.header("Authorization")
        if credentials is not None and self._digest_ok(request, credentials):
            return None
        nonce = secrets.token_hex(16)
        self._nonces.append(nonce)
        return 401, [("WWW-Authenticate", challenge) for challenge in digest.challenges(config.realm, nonce)]

    def _digest_ok(self, request: SipRequest, credentials: str) -> bool:
        config = self.config
        assert config.username is not None and config.password is not None
        return digest.verify(
            credentials, method=request.method, realm=config.realm, username=config.username, password=config.password,
            nonce_valid=self._nonces.__contains__,
        )  # fmt: skip

    # --------------------------------------------------------------- responses

    def _on_response(self, response: SipResponse, source: Address, now_ms: int) -> None:
        dialog = self.dialogs.get(response.call_id)
        number, method = response.cseq
        if dialog is not None and method == "REFER" and dialog.transfer is not None and dialog.transfer.cseq == number:
            self._on_refer_response(dialog, response)
            return
        if dialog is None or method != "BYE":
            self._events.append(Dropped("stray_response", source))
            return
        if response.status < 200:
            return
        for retransmit in [r for r in dialog.retransmits if r.kind is TxKind.BYE and r.cseq == number]:
            dialog.retransmits.remove(retransmit)
        if dialog.state is DialogState.ENDING:
            self._transition(dialog, Trigger.BYE_DONE)
            dialog.ended_at_ms = now_ms

    def _on_refer_response(self, dialog: Dialog, response: SipResponse) -> None:
        assert dialog.transfer is not None
        if response.status >= 200:
            dialog.retransmits = [r for r in dialog.retransmits if r.kind is not TxKind.REFER]
        outcome = dialog.transfer.on_response(response.status, response.reason)  # 202: the outcome comes in a NOTIFY
        if outcome is not None:
            self._transfer_ended(dialog, outcome)

    def _answer_invite(self, dialog: Dialog, request: SipRequest, now_ms: int) -> None:
        extra = [("Contact", self._contact(request))]
        extra.extend(("Record-Route", value) for value in request.headers_all("Record-Route"))
        extra.extend(self._capabilities())
        extra.append(("Content-Type", "application/sdp"))
        sent = self._respond(request, dialog.source, 200, now_ms, to_tag=dialog.local_tag, extra=extra, body=dialog.sdp.encode())
        dialog.retransmits.append(retransmission_of(TxKind.INVITE_2XX, sent, now_ms, request.cseq[0]))

    def _final(
        self,
        request: SipRequest,
        source: Address,
        status: int,
        now_ms: int,
        *,
        to_tag: str | None = None,
        extra: list[tuple[str, str]] | None = None,
        reason: str | None = None,
    ) -> None:
        """A non-2xx final response to an INVITE: retransmitted until its ACK (Timer G/H)."""
        sent = self._respond(request, source, status, now_ms, to_tag=to_tag or secrets.token_hex(6), extra=extra, reason=reason)
        self._invite_branches[server_transaction_key(request)] = request.call_id
        self._final_retransmits[server_transaction_key(request)] = retransmission_of(TxKind.INVITE_FINAL, sent, now_ms)

    def _respond(
        self,
        request: SipRequest,
        source: Address,
        status: int,
        now_ms: int,
        *,
        to_tag: str | None = None,
        extra: list[tuple[str, str]] | None = None,
        body: bytes = b"",
        reason: str | None = None,
    ) -> Outgoing:
        response = SipResponse(status=status, reason=reason or REASON_PHRASES.get(status, "Unknown"))
        vias = request.headers_all("Via")
        destination = source
        if vias:
            top, rest = vias[0], vias[1:]
            sent_by, params = split_params(top)
            via_host, via_port = via_sent_by(sent_by)
            if "rport" in params:
                top = with_param(top, "rport", str(source[1]))
            elif request.transport == "UDP":
                destination = (source[0], via_port)  # over TCP: back on the connection it came on
            if via_host != source[0]:
                top = with_param(top, "received", source[0])
            response.add("Via", top)
            for via in rest:
                response.add("Via", via)
        response.add("From", request.header("From") or "")
        to = request.header("To") or ""
        if status > 100 and header_param(to, "tag") is None:  # §8.2.6.2
            to = f"{to};tag={to_tag or secrets.token_hex(6)}"
        response.add("To", to)
        response.add("Call-ID", request.call_id)
        response.add("CSeq", request.header("CSeq") or "")
        response.add("Server", self.config.user_agent)
        for name, value in extra or []:
            response.add(name, value)
        response.body = body
        sent = Outgoing(response.serialize(), destination, request.transport)
        self._out.append(sent)
        if request.method == "INVITE" or status >= 200:
            key = (server_transaction_key(request), request.method)
            self._cache.pop(key, None)  # to the end: the cache stays in the order its entries expire
            self._cache[key] = (sent, now_ms + TIMEOUT_MS)
        return sent

    def _contact(self, request: SipRequest) -> str:
        suffix = ";transport=tcp" if request.transport == "TCP" else ""
        return f"<sip:callbridge@{host_port(self.config.host, self.config.port)}{suffix}>"

    def _capabilities(self) -> list[tuple[str, str]]:
        return [("Allow", ALLOW), ("Accept", "application/sdp"), ("Supported", ", ".join(sorted(_SUPPORTED)))]

    # ---------------------------------------------------------------- our BYE

    def _in_dialog_request(self, dialog: Dialog, method: str) -> SipRequest:
        """A request of ours in the dialog (§12.2.1.1): to the remote target, our tag in From, the next CSeq,
        the Record-Route set as Route."""
        invite = dialog.invite
        dialog.local_cseq += 1
        request = SipRequest(method=method, uri=uri_of(invite.header("Contact") or invite.header("From") or ""))
        branch = "z9hG4bK" + secrets.token_hex(8)
        request.add("Via", f"SIP/2.0/{invite.transport} {host_port(self.config.host, self.config.port)};branch={branch};rport")
        request.add("Max-Forwards", "70")
        to = invite.header("To") or ""
        if header_param(to, "tag") is None:
            to = f"{to};tag={dialog.local_tag}"
        request.add("From", to)
        request.add("To", invite.header("From") or "")
        request.add("Call-ID", dialog.call_id)
        request.add("CSeq", f"{dialog.local_cseq} {method}")
        for route in invite.headers_all("Record-Route"):
            request.add("Route", route)
        request.add("User-Agent", self.config.user_agent)
        return request

    def _send_bye(self, dialog: Dialog, now_ms: int, reason: str = "hung_up") -> None:
        invite = dialog.invite
        request = self._in_dialog_request(dialog, "BYE")
        sent = Outgoing(request.serialize(), dialog.source, invite.transport)
        self._out.append(sent)
        if dialog.transfer is not None:
            self._transfer_ended(dialog, TransferOutcome(False, 0, "the call ended"))
        dialog.retransmits = [r for r in dialog.retransmits if r.kind is not TxKind.INVITE_2XX]
        dialog.retransmits.append(retransmission_of(TxKind.BYE, sent, now_ms, dialog.local_cseq))
        if dialog.state is DialogState.CONFIRMED:
            self._transition(dialog, Trigger.BYE_SENT)
        self._events.append(CallEnded(dialog.call_id, reason))

    # ------------------------------------------------------------------ timers

    def _resend(self, retransmit: Retransmission, now_ms: int) -> None:
        if retransmit.resend(now_ms):  # ``transaction.Retransmission``: which kinds go again over TCP
            self._out.append(Outgoing(retransmit.data, retransmit.address, retransmit.transport))

    def _gave_up(self, dialog: Dialog, retransmit: Retransmission, now_ms: int) -> None:
        if retransmit.kind is TxKind.INVITE_2XX and dialog.state is DialogState.ANSWERED:
            self._transition(dialog, Trigger.NO_ACK)  # §13.3.1.4: no ACK → end the dialog with a BYE
            self._send_bye(dialog, now_ms, "no_ack")
        elif retransmit.kind is TxKind.RELIABLE_1XX and dialog.state is DialogState.OFFERED:
            self.reject(dialog.call_id, 504, now_ms)  # RFC 3262 §3: no PRACK in 64·T1 → a 5xx
            self._events.append(CallEnded(dialog.call_id, "no_prack"))
        elif retransmit.kind is TxKind.REFER and dialog.transfer is not None:
            self._transfer_ended(dialog, TransferOutcome(False, 408, "no answer to the REFER"))
        elif retransmit.kind is TxKind.BYE and dialog.state is DialogState.ENDING:
            self._transition(dialog, Trigger.BYE_DONE)
            dialog.ended_at_ms = now_ms

    # ----------------------------------------------------------------- helpers

    def _dialog_of(self, request: SipRequest) -> Dialog | None:
        dialog = self.dialogs.get(request.call_id)
        if dialog is None:
            return None
        to_tag = header_param(request.header("To") or "", "tag")
        from_tag = header_param(request.header("From") or "", "tag")
        remote_tag = header_param(dialog.invite.header("From") or "", "tag")
        if to_tag != dialog.local_tag or from_tag != remote_tag:
            return None
        return dialog

    def _end(self, dialog: Dialog, reason: str, now_ms: int, *, announce: bool = True) -> None:
        dialog.retransmits = [r for r in dialog.retransmits if r.kind is TxKind.BYE]
        if dialog.transfer is not None:
            self._transfer_ended(dialog, TransferOutcome(False, 0, "the call ended"))
        dialog.ended_at_ms = now_ms
        if announce:
            self._events.append(CallEnded(dialog.call_id, reason))

    def _transition(self, dialog: Dialog, trigger: Trigger) -> None:
        try:
            dialog.state = TRANSITIONS[(dialog.state, trigger)]
        except KeyError:
            raise DialogStateError(f"{trigger.value} while {dialog.state.value} ({dialog.call_id})") from None


def _placeholder(source: Address) -> MediaChoice:
    """The media of a delayed offer until the answer comes: PCMU, nowhere to send yet."""
    line = "m=audio 0 RTP/AVP 0 8"
    return MediaChoice(AudioEncoding.PCMU, 0, None, source[0], 0, Direction.SENDRECV, None, 0, (line,))
