"""HTTP digest authentication as SIP uses it (RFC 3261 §22, RFC 2617, RFC 7616 algorithms per RFC 8760), the
client side: read a ``WWW-Authenticate`` / ``Proxy-Authenticate`` challenge, build the ``Authorization`` /
``Proxy-Authorization`` answer.

Algorithms: MD5, SHA-256 and SHA-512-256, each also ``-sess``. When a
response carries several challenges (RFC 8760 §2.4: one per algorithm), the
strongest we support is answered. ``qop=auth`` is used when offered (with a
fresh ``cnonce`` and the nonce count); a challenge that offers only
``auth-int`` cannot be answered (no body hashing for REGISTER is needed).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

__all__ = ["DigestChallenge", "authorization", "best_challenge", "parse_challenge"]

_HASHES: Final = {"MD5": "md5", "SHA-256": "sha256", "SHA-512-256": "sha512_256"}
_STRENGTH: Final = ("MD5", "SHA-256", "SHA-512-256")
"""Weakest first: the last one offered wins."""


@dataclass(frozen=True, slots=True)
class DigestChallenge:
    realm: str
    nonce: str
    algorithm: str = "MD5"
    """As the challenge spells it, ``-sess`` included (``SHA-256-sess``); echoed in the answer."""
    opaque: str | None = None
    qop: tuple[str, ...] = ()
    stale: bool = False
    """RFC 2617 §3.2.1: the credentials were right, the nonce was old: answer again at once."""

    @property
    def supported(self) -> bool:
        return _base(self.algorithm) in _HASHES and (not self.qop or "auth" in self.qop)


def _base(algorithm: str) -> str:
    return algorithm.upper().removesuffix("-SESS")


def _hash(algorithm: str, text: str) -> str:
    return hashlib.new(_HASHES[_base(algorithm)], text.encode(), usedforsecurity=False).hexdigest()


def _params(text: str) -> dict[str, str]:
    """``a="x, y", b=z`` → {"a": "x, y", "b": "z"}: commas inside quotes stay."""
    params: dict[str, str] = {}
    parts, quoted, start = [], False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for part in parts:
        key, _, value = part.strip().partition("=")
        if key:
            params[key.strip().lower()] = value.strip().strip('"')
    return params


def parse_challenge(header: str) -> DigestChallenge | None:
    """One ``WWW-Authenticate`` / ``Proxy-Authenticate`` value; None when it is not a digest challenge with a
    realm and a nonce."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "digest":
        return None
    params = _params(rest)
    if "realm" not in params or not params.get("nonce"):
        return None
    qop = tuple(q.strip().lower() for q in params.get("qop", "").split(",") if q.strip())
    return DigestChallenge(
        realm=params["realm"],
        nonce=params["nonce"],
        algorithm=params.get("algorithm", "MD5"),
        opaque=params.get("opaque"),
        qop=qop,
        stale=params.get("stale", "").lower() == "true",
    )


def best_challenge(headers: list[str]) -> DigestChallenge | None:
    """The strongest challenge we can answer among ``headers`` (RFC 8760 §2.4), or None."""
    usable = [c for c in map(parse_challenge, headers) if c is not None and c.supported]
    if not usable:
        return None
    return max(usable, key=lambda c: _STRENGTH.index(_base(c.algorithm)))


def authorization(
    challenge: DigestChallenge, *, method: str, uri: str, username: str, password: str, cnonce: str, nonce_count: int
) -> str:
    """The credentials answering ``challenge`` for a ``method`` request to ``uri`` (RFC 2617 §3.2.2, RFC 7616
    §3.4.1). ``nonce_count`` counts the requests answered with this nonce, from 1."""
    algorithm = challenge.algorithm
    ha1 = _hash(algorithm, f"{username}:{challenge.realm}:{password}")
    if algorithm.upper().endswith("-SESS"):
        ha1 = _hash(algorithm, f"{ha1}:{challenge.nonce}:{cnonce}")
    ha2 = _hash(algorithm, f"{method}:{uri}")
    fields = [f'username="{username}"', f'realm="{challenge.realm}"', f'nonce="{challenge.nonce}"', f'uri="{uri}"']
    if "auth" in challenge.qop:
        nc = f"{nonce_count:08x}"
        response = _hash(algorithm, f"{ha1}:{challenge.nonce}:{nc}:{cnonce}:auth:{ha2}")
        fields += [f'response="{response}"', f"algorithm={algorithm}", f'cnonce="{cnonce}"', "qop=auth", f"nc={nc}"]
    else:
        response = _hash(algorithm, f"{ha1}:{challenge.nonce}:{ha2}")
        fields += [f'response="{response}"', f"algorithm={algorithm}"]
    if challenge.opaque is not None:
        fields.append(f'opaque="{challenge.opaque}"')
    return "Digest " + ", ".join(fields)
