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
- A dialog our own INVITE made (``adopt``, from ``sip/uac.py``) is served like one we answered.
- Unknown dialog → 481; a method we know but do not do → 405 + ``Allow``; one
  we do not know → 501; a malformed request with enough headers to answer →
  400; anything else is dropped (``Dropped``, counted by the server).

Responses, their retransmission and the requests we send in a dialog are written as ``sip/uas_messages.py`` says
(RFC 3581 addressing; BYEs to the address the INVITE came from, the Record-Route set as ``Route``); whether a new
INVITE is taken, as ``sip/invite_offer.py`` says.
"""

from __future__ import annotations

import secrets
from typing import Final

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
from callbridge.sip.invite_offer import Admission, Refusal, read_offer
from callbridge.sip.message import (
    SipParseError,
    SipParseReason,
    SipRequest,
    SipResponse,
    display_name_of,
    dtmf_relay_digits,
    header_param,
    host_port,
    parse_message,
    server_transaction_key,
    uri_of,
)
from callbridge.sip.rate_limit import SourceBudgets
from callbridge.sip.refer import Transfer, TransferOutcome, notify_status, refer_to
from callbridge.sip.sdp import MediaChoice, SdpError, answer, choose, offer, read_answer
from callbridge.sip.srtp import KEY_BYTES
from callbridge.sip.transaction import TIMEOUT_MS, Address, Due, Outgoing, Retransmission, TxKind, retransmission_of
from callbridge.sip.uas_messages import (
    ALLOW,
    ServerTransactions,
    capabilities,
    contact,
    in_dialog_request,
    refer_request,
)

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

_KNOWN_UNSUPPORTED: Final = frozenset({"REGISTER", "SUBSCRIBE", "MESSAGE", "UPDATE", "REFER", "PUBLISH"})

class SipUas:
    """Every SIP dialog of one listener. See the module docstring."""

    def __init__(self, config: UasConfig) -> None:
        self.config = config
        self._budgets = SourceBudgets(config.source_requests_per_s, config.requests_per_s)
        self.dialogs: dict[str, Dialog] = {}
        self._out: list[Outgoing] = []
        self._events: list[SipEvent] = []
        self._responses = ServerTransactions(config, self._out)
        """Our responses, kept for retransmitted requests; non-2xx INVITE finals until their ACK."""
        self._admission = Admission(config)
        """Who may call (``sip/invite_offer.py``)."""

    # ------------------------------------------------------------------ outputs

    def datagrams_to_send(self) -> list[Outgoing]:
        out = self._out[:]  # the list is shared with the server transactions: taken by copy, not swapped
        self._out.clear()
        return out

    def events(self) -> list[SipEvent]:
        events, self._events = self._events, []
        return events

    def next_deadline_ms(self) -> int | None:
        deadlines = [r.deadline_ms for d in self.dialogs.values() for r in d.retransmits]
        deadlines.extend(self._responses.deadlines())
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
                    self._responses.respond(exc.request, source, 513, now_ms, reason="Message Too Large")
                else:
                    self._responses.respond(exc.request, source, 400, now_ms, reason=f"Bad Request ({exc.reason.value})")
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
        dialog.sdp = _our_sdp(dialog, self.config)
        # RFC 3262 §3: our 180 has no SDP, so the 200 need not wait for its PRACK; the 180 stops, a late PRACK
        # still gets its 200
        dialog.retransmits = [r for r in dialog.retransmits if r.kind is not TxKind.RELIABLE_1XX]
        self._answer_invite(dialog, dialog.invite, now_ms)

    def adopt(self, dialog: Dialog) -> None:
        """A dialog our own INVITE made (``sip/uac.py``: a call the agent placed, confirmed, its ACK sent): from now
        on this serves it as one it answered — BYE either way, re-INVITE, INFO, REFER, OPTIONS."""
        if dialog.state is not DialogState.CONFIRMED or dialog.call_id in self.dialogs:
            raise DialogStateError(f"cannot adopt {dialog.call_id} ({dialog.state.value})")
        self.dialogs[dialog.call_id] = dialog

    def ring(self, call_id: str, now_ms: int) -> None:
        """``180 Ringing`` for an offered call (the server answers after ``sip.answer_delay_ms``). Reliable when
        the INVITE required ``100rel`` (RFC 3262 §3): ``RSeq``, retransmitted at T1, 2·T1, 4·T1 … until its
        PRACK; none by 64·T1 → 504 to the INVITE and ``CallEnded("no_prack")``."""
        dialog = self.dialogs.get(call_id)
        if dialog is None or dialog.state is not DialogState.OFFERED or dialog.unacked_rseq is not None:
            return  # §3: no second reliable provisional response before the first is acknowledged
        extra = [("Contact", contact(self.config, dialog.invite))]
        extra.extend(("Record-Route", value) for value in dialog.invite.headers_all("Record-Route"))
        if dialog.reliable_provisional:
            dialog.rseq = dialog.rseq + 1 if dialog.rseq else 1 + secrets.randbelow(2**31 - 1)  # §3: 1 … 2**31 − 1
            dialog.unacked_rseq = dialog.rseq
            extra += [("Require", "100rel"), ("RSeq", str(dialog.rseq))]
        sent = self._responses.respond(dialog.invite, dialog.source, 180, now_ms, to_tag=dialog.local_tag, extra=extra)
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
        self._responses.final(dialog.invite, dialog.source, status, now_ms, to_tag=dialog.local_tag, extra=extra)
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
        request = refer_request(self.config, dialog, target)
        sent = Outgoing(request.serialize(), dialog.source, dialog.invite.transport)
        self._out.append(sent)
        dialog.transfer = Transfer(dialog.local_cseq, now_ms + TIMEOUT_MS)
        dialog.retransmits.append(retransmission_of(TxKind.REFER, sent, now_ms, dialog.local_cseq))

    def tick(self, now_ms: int) -> None:
        """Retransmit what is due, give up on what timed out, forget old transactions."""
        self._responses.tick(now_ms, self._resend)
        for dialog in list(self.dialogs.values()):
            if dialog.ended_at_ms is not None and dialog.ended_at_ms + TIMEOUT_MS <= now_ms:
                del self.dialogs[dialog.call_id]
                self._responses.invite_branches.pop(dialog.invite_branch, None)
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
        cached = self._responses.cached(request)
        if cached is not None and request.method != "ACK":
            self._out.append(cached)  # a retransmitted request
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
                self._responses.respond(request, source, 481, now_ms)
            else:
                self._responses.respond(request, source, 200, now_ms, extra=capabilities())
        elif method == "INFO":
            self._on_info(request, source, now_ms)
        elif method == "NOTIFY":
            self._on_notify(request, source, now_ms)
        elif method == "PRACK":
            self._on_prack(request, source, now_ms)
        elif method in _KNOWN_UNSUPPORTED:
            self._responses.respond(request, source, 405, now_ms, extra=[("Allow", ALLOW)])
        else:
            self._responses.respond(request, source, 501, now_ms, extra=[("Allow", ALLOW)])

    def _on_invite(self, request: SipRequest, source: Address, now_ms: int) -> None:
        if header_param(request.header("To") or "", "tag") is not None:
            dialog = self._dialog_of(request)
            if dialog is None or dialog.state is DialogState.ENDED:
                self._responses.respond(request, source, 481, now_ms)
            else:
                self._on_reinvite(dialog, request, source, now_ms)
            return
        if request.call_id in self.dialogs:
            existing = self.dialogs[request.call_id]
            if existing.invite_branch != server_transaction_key(request):
                self._responses.respond(request, source, 482, now_ms)  # the same call again on another path
            return
        offered = self._admission.refusal(request, source) or read_offer(request, source, self.config.media_encryption, self.config.codecs)
        if isinstance(offered, Refusal):
            self._responses.final(request, source, offered.status, now_ms, extra=offered.extra, reason=offered.reason)
            return
        choice = offered
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
        self._responses.invite_branches[server_transaction_key(request)] = dialog.call_id
        self._responses.respond(request, source, 100, now_ms)
        sender = request.header("From") or ""
        caller, callee = uri_of(sender), uri_of(request.header("To") or "")
        extension = tuple((name, value) for name, value in request.headers if name.lower().startswith("x-"))
        self._events.append(
            CallOffered(dialog.call_id, source, choice, caller, callee, dialog.delayed_offer, display_name_of(sender), extension)
        )

    def _on_reinvite(self, dialog: Dialog, request: SipRequest, source: Address, now_ms: int) -> None:
        cseq = request.cseq[0]
        if cseq <= dialog.remote_cseq or dialog.state not in (DialogState.ANSWERED, DialogState.CONFIRMED):
            self._responses.final(request, source, 500, now_ms, to_tag=dialog.local_tag, extra=[("Retry-After", "1")])
            return
        dialog.remote_cseq = cseq
        if request.body:
            try:  # our SRTP key stays the call's
                choice = choose(request.body.decode("utf-8", "replace"), encryption=self.config.media_encryption, local_key=keys.local_key if (keys := dialog.choice.srtp) else None, codecs=self.config.codecs)
            except SdpError:
                choice = None
            if choice is None or choice.encoding is not dialog.choice.encoding or (choice.srtp is None) != (keys is None):
                self._responses.final(request, source, 488, now_ms, to_tag=dialog.local_tag)
                return
            changed = _media_of(choice) != _media_of(dialog.choice)
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
        retransmit = self._responses.final_retransmits.pop(server_transaction_key(request), None)
        if retransmit is not None:  # ACK of a non-2xx final response: the transaction is done
            if request.call_id not in self.dialogs:  # a cancelled call's entry goes with its dialog
                self._responses.invite_branches.pop(server_transaction_key(request), None)
            return
        dialog = self._dialog_of(request)
        if dialog is None:
            return
        cseq = request.cseq[0]
        dialog.retransmits = [r for r in dialog.retransmits if not (r.kind is TxKind.INVITE_2XX and r.cseq == cseq)]
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
        try:
            body = ack.body.decode("utf-8", "replace") if ack.body and ack.media_type == "application/sdp" else None
            choice = read_answer(body, self.config.codecs, dialog.offer_srtp_key) if body is not None else None
        except SdpError:
            choice = None
        if choice is None:
            self._send_bye(dialog, now_ms, "bad_answer")
            return False
        dialog.choice = choice  # ``dialog.sdp`` stays the offer we sent: a re-INVITE's answer bumps the version
        self._events.append(OfferAnswered(dialog.call_id, choice))
        return True

    def _on_cancel(self, request: SipRequest, source: Address, now_ms: int) -> None:
        call_id = self._responses.invite_branches.get(server_transaction_key(request))
        dialog = self.dialogs.get(call_id) if call_id is not None else None
        if dialog is None:
            self._responses.respond(request, source, 481, now_ms)
            return
        self._responses.respond(request, source, 200, now_ms, to_tag=dialog.local_tag)
        if dialog.state is DialogState.OFFERED:
            self._transition(dialog, Trigger.CANCEL)
            self._responses.final(dialog.invite, dialog.source, 487, now_ms, to_tag=dialog.local_tag)
            self._end(dialog, "cancelled", now_ms)

    def _on_bye(self, request: SipRequest, source: Address, now_ms: int) -> None:
        dialog = self._dialog_of(request)
        if dialog is None or dialog.state in (DialogState.ENDED, DialogState.OFFERED):
            self._responses.respond(request, source, 481, now_ms)
            return
        self._responses.respond(request, source, 200, now_ms, to_tag=dialog.local_tag)
        self._transition(dialog, Trigger.BYE_RECEIVED)
        self._end(dialog, "bye", now_ms)

    def _on_info(self, request: SipRequest, source: Address, now_ms: int) -> None:
        dialog = self._dialog_of(request)
        if dialog is None or dialog.state is DialogState.ENDED:
            self._responses.respond(request, source, 481, now_ms)
            return
        self._responses.respond(request, source, 200, now_ms, to_tag=dialog.local_tag)
        self._events.extend(DtmfInfo(dialog.call_id, digit) for digit in dtmf_relay_digits(request))

    def _on_prack(self, request: SipRequest, source: Address, now_ms: int) -> None:
        """RFC 3262 §3: a PRACK whose ``RAck`` names our reliable 180 (its RSeq, the INVITE's CSeq) → 200, and
        the 180 stops; anything else → 481. A body (an offer in the PRACK) is not read: our 180 carries none."""
        dialog = self._dialog_of(request)
        rack = (request.header("RAck") or "").split()
        if dialog is None or dialog.state is DialogState.ENDED or dialog.unacked_rseq is None or rack != [
            str(dialog.unacked_rseq), str(dialog.invite.cseq[0]), "INVITE"
        ]:
            self._responses.respond(request, source, 481, now_ms)
            return
        dialog.unacked_rseq = None
        dialog.retransmits = [r for r in dialog.retransmits if r.kind is not TxKind.RELIABLE_1XX]
        self._responses.respond(request, source, 200, now_ms, to_tag=dialog.local_tag)

    def _on_notify(self, request: SipRequest, source: Address, now_ms: int) -> None:
        """The progress of our REFER (RFC 3515 §2.4.4): a sipfrag status line; the first final one decides."""
        dialog = self._dialog_of(request)
        if dialog is None or dialog.state is DialogState.ENDED:
            self._responses.respond(request, source, 481, now_ms)
            return
        status = notify_status(request.header("Event") or request.header("o") or "")
        self._responses.respond(request, source, status, now_ms, to_tag=dialog.local_tag)
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
        extra = [("Contact", contact(self.config, request))]
        extra.extend(("Record-Route", value) for value in request.headers_all("Record-Route"))
        extra.extend(capabilities())
        extra.append(("Content-Type", "application/sdp"))
        sent = self._responses.respond(request, dialog.source, 200, now_ms, to_tag=dialog.local_tag, extra=extra, body=dialog.sdp.encode())
        dialog.retransmits.append(retransmission_of(TxKind.INVITE_2XX, sent, now_ms, request.cseq[0]))

    # ---------------------------------------------------------------- our BYE

    def _send_bye(self, dialog: Dialog, now_ms: int, reason: str = "hung_up") -> None:
        invite = dialog.invite
        request = in_dialog_request(self.config, dialog, "BYE")
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


def _media_of(choice: MediaChoice) -> tuple[object, ...]:
    """What of a media choice, changed by a re-INVITE, the call's RTP must follow."""
    return (choice.direction, choice.remote_host, choice.remote_port, choice.payload_type, choice.dtmf_payload_type, choice.srtp)


def _our_sdp(dialog: Dialog, config: UasConfig) -> str:
    """Our 200's SDP: the answer to the INVITE's offer; for a delayed offer, our offer (``sip.codecs``), SRTP with a new
    key of ours (kept for reading the ACK's answer) where ``media_encryption`` is ``required``."""
    host, port, session, version = dialog.sdp_host, dialog.rtp_port, dialog.session_id, dialog.sdp_version
    if not dialog.delayed_offer:
        return answer(dialog.choice, host=host, port=port, session_id=session, version=version)
    dialog.offer_srtp_key = secrets.token_bytes(KEY_BYTES) if config.media_encryption == "required" else None
    return offer(host=host, port=port, session_id=session, version=version, codecs=config.codecs, srtp_key=dialog.offer_srtp_key)
