"""SIP messages (RFC 3261 §7, §20): parse one datagram into a request or a response, serialize one back.

Header names are case-insensitive and have compact forms (§7.3.3: ``i`` Call-ID,
``v`` Via, ``f`` From, ``t`` To, ``m`` Contact, ``l`` Content-Length, ``c``
Content-Type, ``k`` Supported, ``s`` Subject, ``e`` Content-Encoding); both are
stored under the canonical name. A header folded over several lines (a line
starting with a space or tab continues the previous one, §7.3.1) is unfolded.
Comma-separated values of the list headers we read (Via, Route, Record-Route,
Require, Supported) are split into one entry each, keeping their order.

Over UDP the ``Content-Length`` bounds the body: bytes past it are ignored,
a body shorter than it is an error (§18.3); without it, the body is the rest
of the datagram. Anything else that is not a SIP message raises
``SipParseError`` with a reason; the caller answers ``400`` when it can (the
request had the headers a response needs) or drops the datagram.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "REASON_PHRASES",
    "dtmf_relay_digits",
    "SipParseError",
    "SipParseReason",
    "SipRequest",
    "SipResponse",
    "header_param",
    "host_port",
    "transport_param",
    "parse_message",
    "server_transaction_key",
    "split_list",
    "split_params",
    "split_stream",
    "uri_of",
    "via_sent_by",
    "with_param",
]

REASON_PHRASES: Final = {
    100: "Trying",
    180: "Ringing",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    405: "Method Not Allowed",
    415: "Unsupported Media Type",
    420: "Bad Extension",
    480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist",
    489: "Bad Event",
    482: "Loop Detected",
    486: "Busy Here",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    500: "Server Internal Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Server Time-out",
}
"""The reason phrase our responses carry for each status code we send."""

MAX_MESSAGE_BYTES: Final = 65535
MAX_HEAD_BYTES: Final = 16 * 1024
"""A request's start line and headers: an INVITE through a few proxies (Via, Record-Route) takes 2-4 KiB."""
MAX_HEADER_LINES: Final = 128

_COMPACT: Final = {
    "i": "Call-ID",
    "v": "Via",
    "f": "From",
    "t": "To",
    "m": "Contact",
    "l": "Content-Length",
    "c": "Content-Type",
    "k": "Supported",
    "s": "Subject",
    "e": "Content-Encoding",
    "o": "Event",
    "r": "Refer-To",
    "u": "Allow-Events",
}
_CANONICAL: Final = {
    name.lower(): name
    for name in (
        "Via", "From", "To", "Call-ID", "CSeq", "Contact", "Content-Length", "Content-Type", "Max-Forwards",
        "Record-Route", "Route", "Require", "Supported", "Unsupported", "Allow", "Accept", "Authorization",
        "WWW-Authenticate", "Proxy-Authorization", "User-Agent", "Server", "Subject", "Retry-After", "Warning",
        "Content-Encoding", "Event", "Refer-To", "Allow-Events", "Expires", "Proxy-Require", "Reason",
        "RSeq", "RAck", "Min-Expires",
    )
} | {"www-authenticate": "WWW-Authenticate", "cseq": "CSeq", "call-id": "Call-ID"}
_LIST_HEADERS: Final = frozenset({"Via", "Route", "Record-Route", "Require", "Supported", "Proxy-Require"})
_TOKEN: Final = re.compile(r"^[A-Za-z0-9\-.!%*_+`'~]+$")
_STATUS_LINE: Final = re.compile(r"^SIP/2\.0 ([1-6]\d\d) (.*)$")
_REQUEST_LINE: Final = re.compile(r"^([A-Za-z0-9\-.!%*_+`'~]+) (\S+) SIP/2\.0$")


class SipParseReason(enum.Enum):
    NOT_UTF8 = "not_utf8"
    NO_HEADERS_END = "no_headers_end"
    BAD_START_LINE = "bad_start_line"
    BAD_HEADER = "bad_header"
    BAD_CONTENT_LENGTH = "bad_content_length"
    TRUNCATED_BODY = "truncated_body"
    MISSING_HEADER = "missing_header"
    BAD_CSEQ = "bad_cseq"
    OVERSIZED = "oversized"
    HEAD_TOO_LARGE = "head_too_large"
    """Headers over ``MAX_HEAD_BYTES`` or ``MAX_HEADER_LINES``: answered 513 (Message Too Large) where it can be."""


class SipParseError(Exception):
    """The bytes are not a SIP message we can act on. ``request`` holds the parsed request when the fault is
    in its content (a response can still be sent), else None."""

    def __init__(self, reason: SipParseReason, detail: str, request: SipRequest | None = None) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        self.request = request


def _digits(text: str) -> bool:
    """A number we can read: ASCII digits only (RFC 3261's DIGIT; ``str.isdigit`` also holds for "²", which
    ``int`` refuses), and few enough of them (no Content-Length or CSeq needs 19; ``int`` refuses 4301)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _canonical(name: str) -> str:
    lower = name.lower()
    if lower in _COMPACT:
        return _COMPACT[lower]
    return _CANONICAL.get(lower) or "-".join(part.capitalize() for part in lower.split("-"))


def split_list(value: str) -> list[str]:
    """Split a comma-separated header value at commas outside quotes and angle brackets."""
    parts: list[str] = []
    depth, quoted, start = 0, False, 0
    for i, ch in enumerate(value):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == "<":
            depth += 1
        elif not quoted and ch == ">":
            depth = max(0, depth - 1)
        elif ch == "," and not quoted and depth == 0:
            parts.append(value[start:i].strip())
            start = i + 1
    parts.append(value[start:].strip())
    return [p for p in parts if p]


@dataclass(slots=True)
class _Message:
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case or compact form), or None."""
        wanted = _canonical(name)
        for key, value in self.headers:
            if key == wanted:
                return value
        return None

    def headers_all(self, name: str) -> list[str]:
        wanted = _canonical(name)
        return [value for key, value in self.headers if key == wanted]

    def add(self, name: str, value: str) -> None:
        self.headers.append((_canonical(name), value))

    def set(self, name: str, value: str) -> None:
        """Replace every value of ``name`` by one."""
        wanted = _canonical(name)
        self.headers = [(k, v) for k, v in self.headers if k != wanted]
        self.headers.append((wanted, value))

    @property
    def call_id(self) -> str:
        return self.header("Call-ID") or ""

    @property
    def cseq(self) -> tuple[int, str]:
        """(number, method); number 0 when unreadable (only a message that failed parsing has one)."""
        number, _, method = (self.header("CSeq") or "0 ").strip().partition(" ")
        return int(number) if _digits(number) else 0, method.strip()

    @property
    def media_type(self) -> str:
        """The body's media type, lower case, without its parameters (``application/sdp``); "" without one."""
        return (self.header("Content-Type") or "").split(";")[0].strip().lower()

    @property
    def top_via(self) -> str:
        return self.header("Via") or ""

    @property
    def branch(self) -> str:
        return header_param(self.top_via, "branch") or ""

    def _serialize(self, start_line: str) -> bytes:
        lines = [start_line]
        lines.extend(f"{name}: {value}" for name, value in self.headers if name != "Content-Length")
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


@dataclass(slots=True)
class SipRequest(_Message):
    method: str = ""
    uri: str = ""
    transport: str = "UDP"
    """What it came over (UDP or TCP): responses go back the same way (§18.2.2). Set by the receiver."""

    def serialize(self) -> bytes:
        return self._serialize(f"{self.method} {self.uri} SIP/2.0")


@dataclass(slots=True)
class SipResponse(_Message):
    status: int = 0
    reason: str = ""

    def serialize(self) -> bytes:
        return self._serialize(f"SIP/2.0 {self.status} {self.reason}")


def split_params(value: str) -> tuple[str, dict[str, str]]:
    """``<sip:a@b>;tag=x;lr`` → (``<sip:a@b>``, {"tag": "x", "lr": ""}); parameters inside ``<>`` stay put."""
    close = value.rfind(">")
    head_end = value.find(";", close + 1 if close >= 0 else 0)
    if head_end < 0:
        return value.strip(), {}
    params: dict[str, str] = {}
    for part in value[head_end + 1 :].split(";"):
        key, _, val = part.strip().partition("=")
        if key:
            params[key.lower()] = val.strip().strip('"')
    return value[:head_end].strip(), params


def header_param(value: str, name: str) -> str | None:
    return split_params(value)[1].get(name.lower())


def uri_of(value: str) -> str:
    """The URI of a name-addr (``"Bob" <sip:bob@x>;tag=1`` → ``sip:bob@x``) or addr-spec."""
    head, _ = split_params(value)
    if "<" in head:
        return head[head.index("<") + 1 : head.rindex(">")] if ">" in head else head
    return head


def display_name_of(value: str) -> str:
    """The display name of a name-addr (``"Bob Smith" <sip:bob@x>`` → ``Bob Smith``); empty where none."""
    head, _ = split_params(value)
    if "<" not in head:
        return ""
    name = head[: head.index("<")].strip()
    return name[1:-1].replace('\\"', '"') if len(name) >= 2 and name[0] == name[-1] == '"' else name


def parse_message(data: bytes) -> SipRequest | SipResponse:
    """One SIP message from one datagram. Raises ``SipParseError``."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise SipParseError(SipParseReason.OVERSIZED, f"{len(data)} bytes")
    end = data.find(b"\r\n\r\n")
    sep = 4
    if end < 0:  # bare LF line ends are tolerated (§7.5 says CRLF; some stacks send LF)
        end, sep = data.find(b"\n\n"), 2
        if end < 0:
            raise SipParseError(SipParseReason.NO_HEADERS_END, "no empty line after the headers")
    try:
        head = data[:end].decode("utf-8")
    except UnicodeDecodeError:
        raise SipParseError(SipParseReason.NOT_UTF8, "headers are not UTF-8") from None
    lines = head.replace("\r\n", "\n").split("\n")
    while lines and not lines[0].strip():  # keep-alive CRLFs before a message (§7.5)
        lines.pop(0)
    if not lines:
        raise SipParseError(SipParseReason.BAD_START_LINE, "empty message")
    start = lines[0]
    message: SipRequest | SipResponse
    if status := _STATUS_LINE.match(start):
        message = SipResponse(status=int(status.group(1)), reason=status.group(2))
    elif request := _REQUEST_LINE.match(start):
        message = SipRequest(method=request.group(1).upper(), uri=request.group(2))
    else:
        raise SipParseError(SipParseReason.BAD_START_LINE, repr(start[:80]))
    if end > MAX_HEAD_BYTES or len(lines) > MAX_HEADER_LINES + 1:
        _raise_head_too_large(message, lines, f"{end} bytes, {len(lines) - 1} lines of headers")
    unfolded: list[str] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):
            if not unfolded:
                raise SipParseError(SipParseReason.BAD_HEADER, "continuation line before any header")
            unfolded[-1] += " " + line.strip()
        elif line:
            unfolded.append(line)
    for line in unfolded:
        header = _header_line(line)
        if header is None:
            raise SipParseError(SipParseReason.BAD_HEADER, repr(line[:80]))
        canonical, value = header
        if canonical in _LIST_HEADERS:
            message.headers.extend((canonical, part) for part in split_list(value))
        else:
            message.headers.append((canonical, value))
    body = data[end + sep :]
    length_text = message.header("Content-Length")
    if length_text is not None:
        if not _digits(length_text):
            raise SipParseError(SipParseReason.BAD_CONTENT_LENGTH, repr(length_text), _request(message))
        length = int(length_text)
        if length > len(body):
            raise SipParseError(
                SipParseReason.TRUNCATED_BODY, f"Content-Length {length} > {len(body)} body bytes", _request(message)
            )
        body = body[:length]
    message.body = body
    for required in ("Via", "From", "To", "Call-ID", "CSeq"):
        if message.header(required) is None:
            raise SipParseError(SipParseReason.MISSING_HEADER, required)
    number, _, method = (message.header("CSeq") or "").partition(" ")
    if not _digits(number) or not method.strip() or int(number) >= 2**31:
        raise SipParseError(SipParseReason.BAD_CSEQ, repr(message.header("CSeq")), _request(message))
    if isinstance(message, SipRequest) and method.strip().upper() != message.method:
        raise SipParseError(SipParseReason.BAD_CSEQ, f"CSeq method {method.strip()!r} on a {message.method}", message)
    return message


_CONTENT_LENGTH: Final = re.compile(rb"^(?:content-length|l)[ \t]*:[ \t]*(\S*)", re.IGNORECASE | re.MULTILINE)


def split_stream(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Cut a TCP byte stream into whole messages (each framed by its ``Content-Length``, mandatory over TCP,
    §18.3); the rest waits for more bytes. CRLF keep-alives between messages are skipped. Raises
    ``SipParseError`` (the connection cannot be re-synchronised: close it)."""
    messages: list[bytes] = []
    pos = 0
    while True:
        while buffer.startswith(b"\r\n", pos):
            pos += 2
        end = buffer.find(b"\r\n\r\n", pos)
        if end < 0:
            if len(buffer) - pos > MAX_MESSAGE_BYTES:
                raise SipParseError(SipParseReason.OVERSIZED, f"{len(buffer) - pos} bytes without the end of the headers")
            return messages, buffer[pos:]
        found = _CONTENT_LENGTH.search(buffer, pos, end)
        if found is None:
            raise SipParseError(SipParseReason.BAD_CONTENT_LENGTH, "no Content-Length on a stream transport")
        if not found.group(1).isdigit() or int(found.group(1)) > MAX_MESSAGE_BYTES:
            raise SipParseError(SipParseReason.BAD_CONTENT_LENGTH, repr(found.group(1)[:20]))
        total = end + 4 + int(found.group(1))
        if total > len(buffer):
            return messages, buffer[pos:]
        messages.append(buffer[pos:total])
        pos = total


def _raise_head_too_large(message: SipRequest | SipResponse, lines: list[str], detail: str) -> None:
    """Refuse a head over its budget, with what a 513 needs of the request (its Via, From, To, Call-ID, CSeq:
    read from the first lines that carry them) where they are there; the rest is not parsed."""
    wanted = {"Via", "From", "To", "Call-ID", "CSeq"}
    for line in lines[1:]:
        header = _header_line(line)
        if header is not None and header[0] in wanted:
            canonical, value = header
            wanted.discard(canonical)
            message.headers.append((canonical, split_list(value)[0] if canonical == "Via" and value else value))
        if not wanted:
            break
    answerable = _request(message) if "CSeq" not in wanted else None
    raise SipParseError(SipParseReason.HEAD_TOO_LARGE, detail, answerable)


def _header_line(line: str) -> tuple[str, str] | None:
    """One header line as (canonical name, value), or None where it is not ``token ":" value``."""
    name, colon, value = line.partition(":")
    name = name.strip()
    if not colon or not _TOKEN.match(name):
        return None
    return _canonical(name), value.strip()


def _request(message: SipRequest | SipResponse) -> SipRequest | None:
    if not isinstance(message, SipRequest):
        return None
    for required in ("Via", "From", "To", "Call-ID"):
        if message.header(required) is None:
            return None
    return message


def server_transaction_key(request: SipRequest) -> str:
    """A server transaction's key: the branch, with the Call-ID and CSeq number so that peers without RFC 3261
    branches (or reusing one) cannot match each other's transactions (§17.2.3)."""
    return f"{request.branch}|{request.call_id}|{request.cseq[0]}"


def via_sent_by(sent_by: str) -> tuple[str, int]:
    """``SIP/2.0/UDP host:port`` → (host, port); 5060 when no port."""
    hostport = sent_by.split()[-1] if sent_by.split() else ""
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = hostport.partition(":")
    return host, int(port) if port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) <= 65535 else 5060


def with_param(value: str, name: str, param: str) -> str:
    """A header value with its parameter ``name`` set to ``param`` (added, or replaced in place)."""
    head, params = split_params(value)
    params[name] = param
    return head + "".join(f";{k}={v}" if v else f";{k}" for k, v in params.items())


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def transport_param(transport: str) -> str:
    """A URI's ``;transport=`` for our Contact on ``transport`` (``UDP``, ``TCP``, ``TLS``): none for UDP, the default;
    TLS keeps ``sip:`` with ``;transport=tls`` (RFC 5630)."""
    return {"TCP": ";transport=tcp", "TLS": ";transport=tls"}.get(transport, "")


def dtmf_relay_digits(request: SipRequest) -> list[str]:
    """The digits an INFO carries as ``application/dtmf-relay`` (``Signal=5``): one a line, ``0-9 * # A-D``."""
    if not (request.header("Content-Type") or "").lower().startswith("application/dtmf-relay"):
        return []
    digits = []
    for line in request.body.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition("=")
        digit = value.strip().upper()
        if key.strip().lower() == "signal" and len(digit) == 1 and digit in "0123456789*#ABCD":
            digits.append(digit)
    return digits
