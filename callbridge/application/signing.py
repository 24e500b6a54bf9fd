"""How callbridge signs what it sends the application (``assistant-request``, ``tool-call``, events), and how the
application checks it: HMAC-SHA256 over ``<timestamp>.<body>`` with the shared ``app.webhook_secret``, in the
``Callbridge-Signature`` header as ``t=<unix seconds>,v1=<hex digest>`` (the carriers' and Stripe's shape). The
timestamp bounds a replay: ``verify`` refuses one older than ``tolerance_s``.

    from callbridge.application import verify_signature
    if not verify_signature(secret, request.headers.get("Callbridge-Signature"), await request.body()):
        return Response(status_code=401)
"""

from __future__ import annotations

import hashlib
import hmac
import time

__all__ = ["SIGNATURE_HEADER", "TOLERANCE_S", "sign", "verify_signature"]

SIGNATURE_HEADER = "Callbridge-Signature"
TOLERANCE_S = 300
"""How old a signed request may be (and how far ahead of the verifier's clock): five minutes, as Stripe and Slack."""


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, now_s: float | None = None) -> str:
    """The ``Callbridge-Signature`` value for ``body`` sent now."""
    timestamp = int(time.time() if now_s is None else now_s)
    return f"t={timestamp},v1={_digest(secret, timestamp, body)}"


def verify_signature(
    secret: str, header: str | None, body: bytes, *, now_s: float | None = None, tolerance_s: float = TOLERANCE_S
) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` within ``tolerance_s`` of now. Any ``v1`` given may match
    (a secret being rotated: the sender signs with both)."""
    if not header:
        return False
    timestamp: int | None = None
    digests: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1" and value:
            digests.append(value)
    if timestamp is None or not digests:
        return False
    now = time.time() if now_s is None else now_s
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = _digest(secret, timestamp, body)
    return any(hmac.compare_digest(expected, digest) for digest in digests)
