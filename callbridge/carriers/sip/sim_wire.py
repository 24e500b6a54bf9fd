"""The simulated SIP trunk's own strict reader of what the bridge sends (``callbridge.carriers.sip.sim``): SIP messages,
the SDP answer, digest challenges — written apart from ``callbridge.sip`` so that the bridge's parser does not
judge the bridge's output.

``read_sip`` takes CRLF lines only, a start line, ``Name: value`` headers
(compact forms expanded; no folding), the five headers every message carries
plus ``Content-Length``, which must equal the body's length exactly, and a
CSeq whose method matches a request's. ``parse_sdp_answer`` reads an answer to
our one-stream offer as RFC 3264 §6 wants it: one ``m=audio`` line on a real
port, exactly one of the offered codecs first, telephone-event only with its
``rtpmap``, sendrecv, ptime 20. Each returns what it read, or a string that
says what is wrong (the simulator's protocol warning).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import secrets
from dataclasses import dataclass, field
from typing import Final

from callbridge.sip.srtp import OFFER_CRYPTO_TAG, OFFER_SUITE, SrtpKeys, parse_crypto

__all__ = [
    "CODEC_PT",
    "DTMF_PT",
    "RTPMAP",
    "Address",
    "SdpAnswer",
    "SipReply",
    "digest_authorization",
    "name_addr_uri",
    "parse_sdp_answer",
    "parse_sdp_offer",
    "read_sip",
    "tag_param",
    "uri_target",
]

DTMF_PT: Final = 101
"""The telephone-event payload type the simulated trunk offers."""
CODEC_PT: Final = {"PCMU": 0, "PCMA": 8, "G722": 9, "opus": 111}
"""The payload types the simulated trunk offers, by the codec's name in ``sip.codecs`` (Opus's is dynamic: ours)."""
RTPMAP: Final = {0: "PCMU/8000", 8: "PCMA/8000", 9: "G722/8000", 111: "opus/48000/2"}
"""What the answer must call each (the simulator's own table: it checks the bridge's, it does not share it)."""
_COMPACT: Final = {
    "i": "call-id",
    "v": "via",
    "f": "from",
    "t": "to",
    "m": "contact",
    "l": "content-length",
    "c": "content-type",
}
_STATUS_LINE: Final = re.compile(r"^SIP/2\.0 ([1-6]\d\d) ([^\r\n]*)$")
_REQUEST_LINE: Final = re.compile(r"^([A-Z]+) (sips?:\S+) SIP/2\.0$")
_HOST_PORT: Final = re.compile(r"^sips?:(?:[^@;>]+@)?([0-9.]+|\[[0-9a-fA-F:]+\])(?::(\d+))?(?:;.*)?$")

Address = tuple[str, int]


@dataclass(slots=True)
class SipReply:
    """One SIP message from the bridge, as this strict reader saw it: a response (``status``) or a request
    (``method``); header names lower-case, compact forms expanded."""

    status: int = 0
    method: str = ""
    uri: str = ""
    headers: dict[str, list[str]] = field(default_factory=dict)
    body: bytes = b""

    def get(self, name: str) -> str:
        values = self.headers.get(name, [])
        return values[0] if values else ""

    @property
    def cseq(self) -> tuple[int, str]:
        number, _, method = self.get("cseq").partition(" ")
        return (int(number) if number.isdigit() else -1), method.strip()


def read_sip(data: bytes) -> SipReply | str:
    """One SIP message, read strictly: a reply, or what is wrong with it (a protocol warning)."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return "no CRLF CRLF after the headers"
    try:
        head = data[:end].decode("utf-8")
    except UnicodeDecodeError:
        return "headers are not UTF-8"
    lines = head.split("\r\n")
    reply = SipReply()
    if status := _STATUS_LINE.match(lines[0]):
        reply.status = int(status.group(1))
    elif request := _REQUEST_LINE.match(lines[0]):
        reply.method, reply.uri = request.group(1), request.group(2)
    else:
        return f"bad start line {lines[0][:60]!r}"
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or line[:1] in (" ", "\t"):
            return f"bad header line {line[:60]!r}"
        key = _COMPACT.get(name.lower(), name.lower())
        reply.headers.setdefault(key, []).append(value.strip())
    for required in ("via", "from", "to", "call-id", "cseq", "content-length"):
        if required not in reply.headers:
            return f"no {required} header"
    length = reply.get("content-length")
    body = data[end + 4 :]
    if not length.isdigit() or int(length) != len(body):
        return f"Content-Length {length!r} for a {len(body)}-byte body"
    reply.body = body
    number, method = reply.cseq
    if number < 0 or not method or (reply.method and method != reply.method):
        return f"bad CSeq {reply.get('cseq')!r}"
    return reply


def tag_param(value: str) -> str | None:
    for param in value[value.rfind(">") + 1 :].split(";")[1:]:
        key, _, tag = param.strip().partition("=")
        if key.lower() == "tag":
            return tag
    return None


def name_addr_uri(value: str) -> str:
    if "<" in value and ">" in value:
        return value[value.index("<") + 1 : value.index(">")]
    return value.split(";")[0].strip()


def uri_target(uri: str) -> Address | None:
    found = _HOST_PORT.match(uri)
    if found is None:
        return None
    return found.group(1).strip("[]"), int(found.group(2) or 5060)


@dataclass(frozen=True, slots=True)
class SdpAnswer:
    host: str
    port: int
    payload_type: int
    dtmf_payload_type: int | None
    srtp: SrtpKeys | None = None
    """SRTP: the answer's key (what the bridge sends with) and ours."""


def _one_audio_stream(body: bytes, protos: tuple[str, ...]) -> tuple[str, int, str, list[int], list[str]] | str:
    """A one-stream SDP body read strictly, as both sides of the simulated trunk's calls need it: ASCII, CRLF lines,
    ``v=0`` first, o/s/c/t and one ``m=audio`` on a real port in one of ``protos``, an IPv4 ``c=``, numeric formats;
    (host, port, proto, formats, attributes), or what is wrong."""
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        return "SDP is not ASCII"
    if not text.endswith("\r\n"):
        return "SDP lines must end with CRLF"
    lines = text[:-2].split("\r\n")
    if lines[0] != "v=0":
        return "SDP does not start with v=0"
    kinds = [line[:2] for line in lines]
    for required in ("o=", "s=", "c=", "t=", "m="):
        if required not in kinds:
            return f"SDP without {required}"
    if kinds.count("m=") != 1:
        return f"{kinds.count('m=')} m= lines where one stream is offered"
    media = lines[kinds.index("m=")][2:].split()
    connection = lines[kinds.index("c=")][2:].split()
    if len(connection) != 3 or connection[:2] != ["IN", "IP4"]:
        return f"c= {' '.join(connection)!r}"
    try:
        ipaddress.IPv4Address(connection[2])
    except ValueError:
        return f"c= address {connection[2]!r}"
    if len(media) < 4 or media[0] != "audio" or media[2] not in protos or not media[1].isdigit() or not 0 < int(media[1]) < 65536:
        return f"m= {' '.join(media)!r}"
    formats = [int(f) for f in media[3:] if f.isdigit()]
    if len(formats) != len(media) - 3:
        return f"m= formats {media[3:]}"
    return connection[2], int(media[1]), media[2], formats, [line[2:] for line in lines if line.startswith("a=")]


def parse_sdp_answer(body: bytes, offered: tuple[int, ...], srtp_key: bytes | None = None) -> SdpAnswer | str:
    """The bridge's answer to our one-stream offer (RFC 3264 §6), read strictly: the answer, or what is wrong.
    ``srtp_key``: we offered SRTP with this key (``RTP/SAVP``, one crypto line of tag 1): the answer must be in kind,
    with one crypto line of its own."""
    stream = _one_audio_stream(body, ("RTP/AVP",) if srtp_key is None else ("RTP/SAVP",))
    if isinstance(stream, str):
        return stream
    host, port, _, formats, attributes = stream
    codecs = [f for f in formats if f != DTMF_PT]
    if len(codecs) != 1 or codecs[0] not in offered or formats[0] != codecs[0]:
        return f"answer formats {formats}: exactly one audio codec of {list(offered)} must come first"
    dtmf = DTMF_PT if DTMF_PT in formats else None
    if dtmf is not None and f"rtpmap:{DTMF_PT} telephone-event/8000" not in attributes:
        return "telephone-event without its rtpmap"
    if any(a in ("sendonly", "recvonly", "inactive") for a in attributes):
        return "the answer to a sendrecv offer is not sendrecv"
    if any(a.startswith("ptime:") and a != "ptime:20" for a in attributes):
        return "ptime other than 20"
    if f"rtpmap:{codecs[0]} {RTPMAP[codecs[0]]}" not in attributes and codecs[0] >= 96:
        return f"payload type {codecs[0]} without its rtpmap {RTPMAP[codecs[0]]}"
    crypto = [parse_crypto(a[len("crypto:") :]) for a in attributes if a.startswith("crypto:")]
    if srtp_key is None:
        return SdpAnswer(host, port, codecs[0], dtmf) if not crypto else "a crypto line in the answer to plain RTP"
    if len(crypto) != 1 or crypto[0] is None or (crypto[0].tag, crypto[0].suite) != (OFFER_CRYPTO_TAG, OFFER_SUITE):
        return f"the answer to our SRTP offer needs one crypto line of tag {OFFER_CRYPTO_TAG}, {OFFER_SUITE}"
    return SdpAnswer(host, port, codecs[0], dtmf, SrtpKeys(OFFER_SUITE, OFFER_CRYPTO_TAG, crypto[0].key, srtp_key))


def parse_sdp_offer(body: bytes, supported: tuple[int, ...], srtp_key: bytes) -> SdpAnswer | str:
    """The bridge's offer in a call it places (the simulated trunk is the called phone), read strictly (RFC 3264 §5):
    what the phone takes — the first offered codec of ``supported``, telephone-event where offered, SRTP (with
    ``srtp_key``, ours) where the offer is ``RTP/SAVP`` with one crypto line — or what is wrong."""
    stream = _one_audio_stream(body, ("RTP/AVP", "RTP/SAVP"))
    if isinstance(stream, str):
        return stream
    host, port, proto, formats, attributes = stream
    names = {int(a[7:].split()[0]): a.split(None, 1)[1] for a in attributes if a.startswith("rtpmap:") and a[7:].split()[0].isdigit()}
    if any(f >= 96 and f not in names for f in formats):
        return f"m= formats {formats}: a dynamic one without its rtpmap"
    codecs = [f for f in formats if f in supported and (f < 96 or names.get(f) == RTPMAP.get(f))]
    if not codecs:
        return f"no codec of {list(supported)} offered ({formats})"
    dtmf = next((f for f in formats if names.get(f, "").lower() == "telephone-event/8000"), None)
    if proto == "RTP/AVP":
        return SdpAnswer(host, port, codecs[0], dtmf)
    crypto = [parse_crypto(a[len("crypto:") :]) for a in attributes if a.startswith("crypto:")]
    taken = next((c for c in crypto if c is not None), None)
    if taken is None:
        return "an RTP/SAVP offer with no crypto line we can take"
    return SdpAnswer(host, port, codecs[0], dtmf, SrtpKeys(taken.suite, taken.tag, taken.key, srtp_key))


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def digest_authorization(challenge: str, method: str, uri: str, username: str, password: str) -> str | None:
    """The ``Authorization`` answer to a ``WWW-Authenticate: Digest …`` challenge (RFC 2617, MD5, qop=auth)."""
    scheme, _, rest = challenge.partition(" ")
    if scheme.lower() != "digest":
        return None
    pairs = (part.partition("=") for part in re.split(r",(?=(?:[^\"]*\"[^\"]*\")*[^\"]*$)", rest))
    params = {key.strip().lower(): value.strip().strip('"') for key, _, value in pairs}
    realm, nonce = params.get("realm"), params.get("nonce")
    if realm is None or nonce is None:
        return None
    cnonce, nc = secrets.token_hex(8), "00000001"
    ha1, ha2 = _md5(f"{username}:{realm}:{password}"), _md5(f"{method}:{uri}")
    if "auth" in params.get("qop", "").split(","):
        response = _md5(f"{ha1}:{nonce}:{nc}:{cnonce}:auth:{ha2}")
        return f'Digest username="{username}", realm="{realm}", nonce="{nonce}", uri="{uri}", response="{response}", algorithm=MD5, cnonce="{cnonce}", qop=auth, nc={nc}'
    return f'Digest username="{username}", realm="{realm}", nonce="{nonce}", uri="{uri}", response="{_md5(f"{ha1}:{nonce}:{ha2}")}", algorithm=MD5'
