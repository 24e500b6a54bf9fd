"""HTTP digest authentication as SIP uses it (RFC 3261 §22, RFC 2617, RFC 7616 algorithms per RFC 8760), both
sides: the client reads a ``WWW-Authenticate`` / ``Proxy-Authenticate`` challenge and builds the ``Authorization``
/ ``Proxy-Authorization`` answer (REGISTER); the server challenges (``challenges``) and checks an answer
(``verify``: INVITEs from outside the trusted networks).

Algorithms: MD5, SHA-256 and SHA-512-256, each also ``-sess``. When a
response carries several challenges (RFC 8760 §2.4: one per algorithm), the
strongest we support is answered. ``qop=auth`` is used when offered (with a
fresh ``cnonce`` and the nonce count); a challenge that offers only
``auth-int`` cannot be answered (no body hashing for REGISTER is needed).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = ["CHALLENGE_ALGORITHMS", "DigestChallenge", "authorization", "best_challenge", "challenges", "parse_challenge", "verify"]

_HASHES: Final = {"MD5": "md5", "SHA-256": "sha256", "SHA-512-256": "sha512_256"}
_STRENGTH: Final = ("MD5", "SHA-256", "SHA-512-256")
"""Weakest first: the last one offered wins."""
CHALLENGE_ALGORITHMS: Final = ("MD5", "SHA-256")
"""What a server challenge offers, one ``WWW-Authenticate`` each (RFC 8760 §2.4). MD5 comes first: many deployed
UACs read only the first challenge and know only MD5; a UAC that reads them all answers the strongest it knows."""


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


def _response(
    algorithm: str, *, username: str, realm: str, password: str, nonce: str, method: str, uri: str,
    qop: str | None, cnonce: str, nc: str,
) -> str:  # fmt: skip
    """The ``response`` value (RFC 2617 §3.2.2.1, RFC 7616 §3.4.1), for either side to compute."""
    ha1 = _hash(algorithm, f"{username}:{realm}:{password}")
    if algorithm.upper().endswith("-SESS"):
        ha1 = _hash(algorithm, f"{ha1}:{nonce}:{cnonce}")
    ha2 = _hash(algorithm, f"{method}:{uri}")
    if qop:
        return _hash(algorithm, f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")
    return _hash(algorithm, f"{ha1}:{nonce}:{ha2}")


def authorization(
    challenge: DigestChallenge, *, method: str, uri: str, username: str, password: str, cnonce: str, nonce_count: int
) -> str:
    """The credentials answering ``challenge`` for a ``method`` request to ``uri`` (RFC 2617 §3.2.2, RFC 7616
    §3.4.1). ``nonce_count`` counts the requests answered with this nonce, from 1."""
    algorithm = challenge.algorithm
    qop = "auth" if "auth" in challenge.qop else None
    nc = f"{nonce_count:08x}"
    response = _response(
        algorithm, username=username, realm=challenge.realm, password=password, nonce=challenge.nonce, method=method,
        uri=uri, qop=qop, cnonce=cnonce, nc=nc,
    )  # fmt: skip
    fields = [f'username="{username}"', f'realm="{challenge.realm}"', f'nonce="{challenge.nonce}"', f'uri="{uri}"']
    fields += [f'response="{response}"', f"algorithm={algorithm}"]
    if qop is not None:
        fields += [f'cnonce="{cnonce}"', "qop=auth", f"nc={nc}"]
    if challenge.opaque is not None:
        fields.append(f'opaque="{challenge.opaque}"')
    return "Digest " + ", ".join(fields)


def challenges(realm: str, nonce: str) -> list[str]:
    """The ``WWW-Authenticate`` values of a server's 401: one per ``CHALLENGE_ALGORITHMS``, ``qop="auth"``."""
    return [f'Digest realm="{realm}", nonce="{nonce}", algorithm={algorithm}, qop="auth"' for algorithm in CHALLENGE_ALGORITHMS]


def verify(header: str, *, method: str, realm: str, username: str, password: str, nonce_valid: Callable[[str], bool]) -> bool:
    """Whether ``header`` (an ``Authorization`` value) answers one of our challenges: our realm and user, a nonce we
    issued (``nonce_valid``), one of ``CHALLENGE_ALGORITHMS`` (``-sess`` too), ``qop`` ``auth`` or none, and the
    right ``response``."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "digest":
        return False
    params = _params(rest)
    algorithm = params.get("algorithm", "MD5")
    nonce, qop = params.get("nonce", ""), params.get("qop") or None
    if (
        params.get("username") != username
        or params.get("realm") != realm
        or not nonce_valid(nonce)
        or _base(algorithm) not in CHALLENGE_ALGORITHMS
        or qop not in (None, "auth")
    ):
        return False
    expected = _response(
        algorithm, username=username, realm=realm, password=password, nonce=nonce, method=method,
        uri=params.get("uri", ""), qop=qop, cnonce=params.get("cnonce", ""), nc=params.get("nc", ""),
    )  # fmt: skip
    return hmac.compare_digest(expected, params.get("response", ""))
