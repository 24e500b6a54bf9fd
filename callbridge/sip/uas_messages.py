"""What the SIP user-agent server (``sip/dialog.py``) writes, sans-I/O: its responses and their server
transactions (RFC 3261 §17.2), and the requests it sends in a dialog (§12.2.1.1).

- A response goes where RFC 3581 says: to the source address when the top Via has ``rport``, else to the source
  IP and the Via's port (over TCP: back on the connection); the top Via gets ``received``/``rport``; a final
  response without a To tag gets one (§8.2.6.2).
- Each INVITE response and each final response is kept ``TIMEOUT_MS`` for its request's retransmissions, in the
  order the entries expire (a flood fills the cache by thousands: neither the deadline nor the pruning reads more
  than the entries due).
- A non-2xx final response to an INVITE is retransmitted until its ACK (Timer G/H); the INVITE's transaction
  key names its call (a CANCEL's match, the ACK of a non-2xx).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Final

from callbridge.sip.dialog_state import Dialog, UasConfig
from callbridge.sip.message import (
    REASON_PHRASES,
    SipRequest,
    SipResponse,
    header_param,
    host_port,
    server_transaction_key,
    split_params,
    transport_param,
    uri_of,
    via_sent_by,
    with_param,
)
from callbridge.sip.refer import refer_to
from callbridge.sip.transaction import TIMEOUT_MS, Address, Due, Outgoing, Retransmission, TxKind, retransmission_of

__all__ = ["ALLOW", "SUPPORTED", "ServerTransactions", "capabilities", "contact", "in_dialog_request", "refer_request"]

ALLOW: Final = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, NOTIFY, PRACK"
SUPPORTED: Final[frozenset[str]] = frozenset({"100rel"})  # Require of anything else → 420


def capabilities() -> list[tuple[str, str]]:
    """The headers that say what we do (OPTIONS, 405, 415, 420)."""
    return [("Allow", ALLOW), ("Accept", "application/sdp"), ("Supported", ", ".join(sorted(SUPPORTED)))]


def contact(config: UasConfig, request: SipRequest) -> str:
    """Our Contact in a dialog that came on ``request``'s transport: the peer's requests in it come back on that
    transport, at our port for it (RFC 3261 §8.1.1.8; TLS: RFC 5630 keeps ``sip:`` with ``;transport=tls``)."""
    return f"<sip:callbridge@{config.host_port(request.transport)}{transport_param(request.transport)}>"


def in_dialog_request(config: UasConfig, dialog: Dialog, method: str) -> SipRequest:
    """A request of ours in the dialog (§12.2.1.1): to the remote target, our tag in From, the next CSeq, the
    Record-Route set as Route."""
    invite = dialog.invite
    dialog.local_cseq += 1
    request = SipRequest(method=method, uri=uri_of(invite.header("Contact") or invite.header("From") or ""))
    branch = "z9hG4bK" + secrets.token_hex(8)
    request.add("Via", f"SIP/2.0/{invite.transport} {config.host_port(invite.transport)};branch={branch};rport")
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
    request.add("User-Agent", config.user_agent)
    return request


def refer_request(config: UasConfig, dialog: Dialog, target: str) -> SipRequest:
    """Our REFER in the dialog (RFC 3515): ``Refer-To: target`` (a SIP or tel URI; a bare number goes to the trunk,
    ``sip:<number>@<trunk host>``)."""
    request = in_dialog_request(config, dialog, "REFER")
    request.add("Refer-To", f"<{refer_to(target, host_port(*dialog.source))}>")
    request.add("Referred-By", f"<sip:callbridge@{host_port(config.host, config.port)}>")
    request.add("Contact", contact(config, dialog.invite))
    return request


class ServerTransactions:
    """The UAS's responses, kept for retransmitted requests, and its non-2xx INVITE finals until their ACK (see the
    module docstring). ``out``: the UAS's datagrams to send, appended to."""

    def __init__(self, config: UasConfig, out: list[Outgoing]) -> None:
        self._config, self._out = config, out
        self._cache: dict[tuple[str, str], tuple[Outgoing, int]] = {}
        """(transaction key, method) → the last response sent and when it may be forgotten."""
        self.invite_branches: dict[str, str] = {}
        """INVITE transaction key → call id (CANCEL matching, ACK of a non-2xx)."""
        self.final_retransmits: dict[str, Retransmission] = {}
        """INVITE transaction key → a non-2xx final response retransmitted until its ACK."""

    def cached(self, request: SipRequest) -> Outgoing | None:
        """The response already sent to ``request`` (it is a retransmission), if one is kept."""
        cached = self._cache.get((server_transaction_key(request), request.method))
        return cached[0] if cached is not None else None

    def respond(
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
        """Send ``status`` in answer to ``request`` from ``source`` (see the module docstring)."""
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
        response.add("Server", self._config.user_agent)
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

    def final(
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
        sent = self.respond(request, source, status, now_ms, to_tag=to_tag or secrets.token_hex(6), extra=extra, reason=reason)
        self.invite_branches[server_transaction_key(request)] = request.call_id
        self.final_retransmits[server_transaction_key(request)] = retransmission_of(TxKind.INVITE_FINAL, sent, now_ms)

    def tick(self, now_ms: int, resend: Callable[[Retransmission, int], None]) -> None:
        """Forget the responses past ``TIMEOUT_MS``; ``resend`` the finals due, give up on those past 64·T1."""
        while self._cache:
            key, (_, until) = next(iter(self._cache.items()))
            if until > now_ms:
                break
            del self._cache[key]
        for branch, retransmit in list(self.final_retransmits.items()):
            due = retransmit.due(now_ms)
            if due is Due.GIVE_UP:
                del self.final_retransmits[branch]
                self.invite_branches.pop(branch, None)
            elif due is Due.RESEND:
                resend(retransmit, now_ms)

    def deadlines(self) -> list[int]:
        """When ``tick`` has something to do next (the first cache entry is the next to expire)."""
        deadlines = [r.deadline_ms for r in self.final_retransmits.values()]
        if self._cache:
            deadlines.append(next(iter(self._cache.values()))[1])
        return deadlines
