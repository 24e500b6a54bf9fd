"""Call transfer by REFER (RFC 3515), the part that is REFER's own: where ``Refer-To`` points, what the REFER's
response and the peer's NOTIFYs (``Event: refer``, a ``message/sipfrag`` body, RFC 3420) say about the transfer,
and when we stop waiting. The dialog (``dialog.SipUas.transfer``) sends the REFER in the call's dialog,
retransmits it (``transaction.TxKind.REFER``) and answers the NOTIFYs; this decides what they mean.

A REFER's final non-2xx ends the transfer failed; after its 2xx (202 Accepted) the first final status line in a
NOTIFY decides (2xx: done; else failed), as does a subscription terminated without one, or no final NOTIFY within
64·T1 of the REFER.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Transfer", "TransferOutcome", "notify_status", "refer_to", "sipfrag_status"]


@dataclass(frozen=True, slots=True)
class TransferOutcome:
    """How a transfer ended: ``ok`` when the peer reported the target's 2xx; otherwise ``status``/``reason`` say
    why (the REFER's own final response, the sipfrag's, 408 for no answer, 0 for a call that ended first)."""

    ok: bool
    status: int
    reason: str


@dataclass(slots=True)
class Transfer:
    """Our REFER in a dialog: its CSeq, and when we stop waiting for the NOTIFY that says how it ended."""

    cseq: int
    deadline_ms: int
    accepted: bool = False

    def on_response(self, status: int, reason: str) -> TransferOutcome | None:
        """The REFER's response: a 2xx accepts it (the outcome comes in a NOTIFY), another final one ends it."""
        if status < 200:
            return None
        if status < 300:
            self.accepted = True
            return None
        return TransferOutcome(False, status, reason)

    def on_notify(self, sipfrag: bytes, subscription_state: str) -> TransferOutcome | None:
        """A NOTIFY of ``Event: refer``: its sipfrag's final status decides; a terminated subscription without
        one ends it failed."""
        status, reason = sipfrag_status(sipfrag)
        if status is not None and status >= 200:
            return TransferOutcome(200 <= status < 300, status, reason)
        if subscription_state.strip().lower().startswith("terminated"):
            return TransferOutcome(False, status or 0, "subscription terminated without a final status")
        return None

    def expired(self, now_ms: int) -> TransferOutcome | None:
        """Accepted, and no final NOTIFY by its deadline."""
        if self.accepted and self.deadline_ms <= now_ms:
            return TransferOutcome(False, 408, "no final NOTIFY for the REFER")
        return None


def refer_to(target: str, trunk: str) -> str:
    """``Refer-To``'s URI: a SIP or tel URI as given; a bare number goes to the trunk (``sip:<number>@<trunk>``)."""
    return target if target.startswith(("sip:", "sips:", "tel:")) else f"sip:{target}@{trunk}"


def notify_status(event_header: str) -> int:
    """How a NOTIFY in a dialog with a transfer is answered: 200 for ``Event: refer``, else 489 (Bad Event)."""
    return 200 if event_header.split(";")[0].strip().lower() == "refer" else 489


def sipfrag_status(body: bytes) -> tuple[int | None, str]:
    """The status line of a ``message/sipfrag`` body (RFC 3420): ``SIP/2.0 200 OK`` → (200, "OK")."""
    first = body.decode("utf-8", "replace").strip().split("\n", 1)[0].strip()
    version, _, rest = first.partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.upper().startswith("SIP/") or not (code.isascii() and code.isdigit() and len(code) == 3):
        return None, first[:100]
    return int(code), reason.strip()
