"""A REGISTER client, sans-I/O (RFC 3261 §10): keep one contact (our SIP listener) bound to one address-of-record
at a registrar, so that a PBX or trunk that only calls registered contacts sends its INVITEs to us.

Inputs: ``start(now_ms)``, ``receive_response(response, now_ms)`` (every SIP
response that came to the listener: the ones that are not ours are left
alone), ``tick(now_ms)``, ``stop(now_ms)`` (un-REGISTER). Outputs, drained
after every input: ``datagrams_to_send()``, ``events()``; sleep until
``next_deadline_ms()``.

Rules:

- One Call-ID and From tag for every REGISTER of this binding, the CSeq one
  higher each time (§10.2.4: a registrar drops a refresh with a new Call-ID's
  lower CSeq only within one Call-ID). A new Via branch per request; a
  request is retransmitted over UDP at T1, 2·T1 … T2 (Timer E) and given up
  at 64·T1 (Timer F: ``RegistrationFailed(408, "timeout")``).
- 401 / 407: answered with digest credentials (``callbridge.sip.digest``),
  once per nonce: a challenge repeating a nonce we already answered means the
  credentials are wrong (``auth_rejected``). The last challenge's nonce is
  reused (next nonce count) on refreshes, saving a round trip where the
  registrar accepts it.
- 423 Interval Too Brief: sent again at once with ``Expires`` = the
  ``Min-Expires`` (§10.2.8).
- 2xx: the expiry granted is our Contact's ``expires`` in the response, else
  its ``Expires``, else what we asked (§10.2.4). The refresh is sent at
  max(half of it, 32 s before it ends): halfway for short bindings, and for
  long ones late enough to be cheap but early enough that the refresh's own
  64·T1 timeout ends before the binding does.
- Any other final status, or no answer: ``RegistrationFailed``, and a retry
  after min(max, base · 2^(failures−1)) times a random 50–100 % (RFC 5626
  §4.5's backoff; base 30 s, max 1800 s by default), or after the response's
  ``Retry-After`` when it has one.
- ``stop``: ``Expires: 0`` for our contact (§10.2.2) when a binding may exist
  (one was granted, a REGISTER is out or went unanswered), challenges answered
  as above; ``Unregistered`` on its final response or at
  its timeout (the binding then expires by itself).
"""

from __future__ import annotations

import enum
import random
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from callbridge.sip.dialog import ALLOW
from callbridge.sip.digest import DigestChallenge, authorization, best_challenge
from callbridge.sip.message import SipRequest, SipResponse, host_port, split_list, split_params, transport_param, uri_of
from callbridge.sip.transaction import TIMEOUT_MS, Address, Due, Outgoing, Retransmission, TxKind

__all__ = [
    "TRANSITIONS",
    "Registered",
    "RegistrationConfig",
    "RegistrationEvent",
    "RegistrationFailed",
    "RegistrationState",
    "RegistrationStateError",
    "SipRegistration",
    "Unregistered",
    "refresh_delay_ms",
]

_REFRESH_MARGIN_MS: Final = TIMEOUT_MS
_TRIED_NONCES: Final = 16


class RegistrationState(enum.Enum):
    IDLE = "idle"
    """Not started."""
    REGISTERING = "registering"
    """A REGISTER is out (the first, a refresh or a retry); challenges and 423s keep it here."""
    REGISTERED = "registered"
    """Bound; the refresh is scheduled."""
    RETRY_WAIT = "retry_wait"
    """The last REGISTER failed; the next one waits for the backoff."""
    UNREGISTERING = "unregistering"
    """Our ``Expires: 0`` is out."""
    STOPPED = "stopped"


class _Trigger(enum.Enum):
    SEND = "send"
    ACCEPTED = "accepted"
    FAILED = "failed"
    STOP = "stop"
    STOP_QUIETLY = "stop_quietly"
    DONE = "done"


_S, _T = RegistrationState, _Trigger
TRANSITIONS: Final[dict[tuple[RegistrationState, _Trigger], RegistrationState]] = {
    (_S.IDLE, _T.SEND): _S.REGISTERING,
    (_S.REGISTERING, _T.ACCEPTED): _S.REGISTERED,
    (_S.REGISTERING, _T.FAILED): _S.RETRY_WAIT,
    (_S.REGISTERED, _T.SEND): _S.REGISTERING,
    (_S.RETRY_WAIT, _T.SEND): _S.REGISTERING,
    (_S.IDLE, _T.STOP_QUIETLY): _S.STOPPED,
    (_S.RETRY_WAIT, _T.STOP_QUIETLY): _S.STOPPED,
    (_S.REGISTERING, _T.STOP): _S.UNREGISTERING,
    (_S.REGISTERED, _T.STOP): _S.UNREGISTERING,
    (_S.RETRY_WAIT, _T.STOP): _S.UNREGISTERING,
    (_S.UNREGISTERING, _T.DONE): _S.STOPPED,
}
"""Every state change of a registration. A pair not listed is a bug in the caller (``RegistrationStateError``)."""


class RegistrationStateError(Exception):
    """The driver called an input the registration's state does not allow (``start`` twice)."""

    def __init__(self, aor: str, state: RegistrationState, trigger: str) -> None:
        super().__init__(f"{trigger} while {state.value} ({aor})")
        self.aor = aor
        self.state = state
        self.trigger = trigger


@dataclass(frozen=True, slots=True)
class Registered:
    """The registrar took our contact for ``expires_s``; the refresh goes in ``refresh_in_ms``."""

    aor: str
    expires_s: int
    refresh_in_ms: int


@dataclass(frozen=True, slots=True)
class RegistrationFailed:
    """A REGISTER ended without a binding: ``status`` (408 for no answer) and a short ``reason`` (a metric
    label: ``timeout``, ``auth_rejected``, ``no_credentials``, ``rejected``, ``interval_too_brief``); the next
    try goes in ``retry_in_ms``."""

    aor: str
    status: int
    reason: str
    retry_in_ms: int


@dataclass(frozen=True, slots=True)
class Unregistered:
    """``stop`` is done: ``status`` of the answer to our ``Expires: 0`` (0: none was needed, 408: no answer)."""

    aor: str
    status: int


RegistrationEvent = Registered | RegistrationFailed | Unregistered


@dataclass(frozen=True, slots=True)
class RegistrationConfig:
    registrar: str
    """The registrar's URI (``sip:pbx.example.com``); the Request-URI, without any user part (§10.2)."""
    aor: str
    """The address-of-record (``sip:1001@pbx.example.com``): To and From."""
    destination: Address
    """Where the REGISTERs go (the registrar's or the outbound proxy's address, resolved by the driver)."""
    contact_host: str
    contact_port: int
    auth_user: str | None = None
    """The digest user name; None: the AOR's user."""
    password: str | None = None
    expires_s: int = 3600
    outbound_proxy: str | None = None
    """A loose-routing proxy's URI, put in ``Route`` (§8.1.2)."""
    retry_base_ms: int = 30_000
    retry_max_ms: int = 1_800_000
    transport: str = "UDP"
    user_agent: str = "callbridge"

    @property
    def user(self) -> str:
        """The AOR's user part (``1001``), also our Contact's."""
        uri = uri_of(self.aor)
        scheme_less = uri.split(":", 1)[1] if ":" in uri else uri
        return scheme_less.split("@", 1)[0] if "@" in scheme_less else "callbridge"


def refresh_delay_ms(expires_s: int) -> int:
    """When to refresh a binding granted for ``expires_s`` (see the module docstring)."""
    expires_ms = expires_s * 1000
    return max(expires_ms // 2, expires_ms - _REFRESH_MARGIN_MS)


@dataclass(slots=True)
class _Register:
    """Our REGISTER in flight: its retransmission, and the expiry it asked for."""

    sent: Retransmission
    expires_s: int

    @property
    def cseq(self) -> int:
        return self.sent.cseq


class SipRegistration:
    """One binding of our contact at one registrar. See the module docstring."""

    def __init__(self, config: RegistrationConfig, *, rand: Callable[[], float] = random.random) -> None:
        self.config = config
        self.state = RegistrationState.IDLE
        self.call_id = f"{secrets.token_hex(12)}@{config.contact_host}"
        self.from_tag = secrets.token_hex(6)
        self.cseq = 0
        self.expires_s = config.expires_s
        """What we ask for: the configured value, raised by a 423's ``Min-Expires``."""
        self.granted_expires_s: int | None = None
        self.failures = 0
        """Consecutive failed REGISTERs (the backoff's exponent); 0 once registered."""
        self._rand = rand
        self._tx: _Register | None = None
        self._refresh_at_ms: int | None = None
        self._retry_at_ms: int | None = None
        self._challenges: dict[str, tuple[DigestChallenge, int]] = {}
        """``Authorization`` / ``Proxy-Authorization`` → the challenge answered, and its nonce count so far."""
        self._tried_nonces: deque[str] = deque(maxlen=_TRIED_NONCES)
        self._removal_sent = False
        self._may_be_bound = False
        """A binding may exist at the registrar: one was granted, or a REGISTER went unanswered."""
        self._out: list[Outgoing] = []
        self._events: list[RegistrationEvent] = []

    # ------------------------------------------------------------------ outputs

    @property
    def contact(self) -> str:
        config = self.config
        return f"sip:{config.user}@{host_port(config.contact_host, config.contact_port)}{transport_param(config.transport)}"

    def datagrams_to_send(self) -> list[Outgoing]:
        out, self._out = self._out, []
        return out

    def events(self) -> list[RegistrationEvent]:
        events, self._events = self._events, []
        return events

    def next_deadline_ms(self) -> int | None:
        deadlines = [d for d in (self._refresh_at_ms, self._retry_at_ms) if d is not None]
        if self._tx is not None:
            deadlines.append(self._tx.sent.deadline_ms)
        return min(deadlines) if deadlines else None

    # ------------------------------------------------------------------- inputs

    def start(self, now_ms: int) -> None:
        """Send the first REGISTER. Drain ``datagrams_to_send`` next. Raises ``RegistrationStateError`` unless
        the registration is new."""
        self._transition(_Trigger.SEND, "start")
        self._send(now_ms, self.expires_s)

    def stop(self, now_ms: int) -> None:
        """Remove our binding (``Expires: 0``) if one may exist, else end at once (``Unregistered(aor, 0)``).
        Drain next; the driver waits for ``Unregistered`` (at most 64·T1). A second call does nothing."""
        if self.state in (RegistrationState.UNREGISTERING, RegistrationState.STOPPED):
            return
        self._refresh_at_ms = self._retry_at_ms = None
        if not self._may_be_bound and self.state is not RegistrationState.REGISTERING:
            self._tx = None
            self._transition(_Trigger.STOP_QUIETLY, "stop")
            self._events.append(Unregistered(self.config.aor, 0))
            return
        in_flight = self.state is RegistrationState.REGISTERING
        self._transition(_Trigger.STOP, "stop")
        if not in_flight:  # else after the REGISTER in flight ends (§10.2: one REGISTER at a time)
            self._send_removal(now_ms)

    def receive_response(self, response: SipResponse, now_ms: int) -> bool:
        """Take ``response`` if it answers our REGISTER in progress (its Call-ID and CSeq): True, then drain.
        False: not ours (the listener's own transactions take it)."""
        tx = self._tx
        if tx is None or response.call_id != self.call_id:
            return response.call_id == self.call_id  # a late answer to an earlier REGISTER of ours: ignored
        if response.cseq != (tx.cseq, "REGISTER"):
            return True
        status = response.status
        if status < 200:
            tx.sent.provisional_received(now_ms)
            return True
        self._tx = None
        if self.state is RegistrationState.UNREGISTERING and not self._removal_sent:
            if status in (401, 407):
                self._take_challenge(response)
            self._send_removal(now_ms)
        elif 200 <= status < 300:
            self._accepted(response, tx, now_ms)
        elif status in (401, 407):
            self._challenged(response, tx, now_ms)
        elif status == 423:
            self._too_brief(response, tx, now_ms)
        else:
            self._failed(now_ms, status, "rejected", _retry_after_ms(response))
        return True

    def tick(self, now_ms: int) -> None:
        """Retransmit, give up, refresh or retry, whatever is due. Drain next."""
        tx = self._tx
        due = tx.sent.due(now_ms) if tx is not None else Due.WAIT
        if tx is not None:
            if due is Due.GIVE_UP:
                self._tx = None
                self._may_be_bound = True  # it may have arrived, and only its answer been lost
                if self.state is RegistrationState.UNREGISTERING and not self._removal_sent:
                    self._send_removal(now_ms)
                else:
                    self._failed(now_ms, 408, "timeout", None)
            elif due is Due.RESEND and tx.sent.resend(now_ms):  # over UDP only (Timer E)
                self._out.append(Outgoing(tx.sent.data, tx.sent.address, tx.sent.transport))
        if self._refresh_at_ms is not None and self._refresh_at_ms <= now_ms:
            self._refresh_at_ms = None
            self._transition(_Trigger.SEND, "refresh")
            self._send(now_ms, self.expires_s)
        if self._retry_at_ms is not None and self._retry_at_ms <= now_ms:
            self._retry_at_ms = None
            self._transition(_Trigger.SEND, "retry")
            self._send(now_ms, self.expires_s)

    # ---------------------------------------------------------------- responses

    def _accepted(self, response: SipResponse, tx: _Register, now_ms: int) -> None:
        if self.state is RegistrationState.UNREGISTERING:
            self._unregistered(response.status)
            return
        granted = self._granted_expires_s(response, tx.expires_s)
        if granted <= 0:  # a 2xx that lists no binding of ours: the registrar did not keep it
            self._failed(now_ms, response.status, "no_binding", None)
            return
        self.granted_expires_s = granted
        self._may_be_bound = True
        self.failures = 0
        self._transition(_Trigger.ACCEPTED, f"{response.status} response")
        delay_ms = refresh_delay_ms(granted)
        self._refresh_at_ms = now_ms + delay_ms
        self._events.append(Registered(self.config.aor, granted, delay_ms))

    def _challenged(self, response: SipResponse, tx: _Register, now_ms: int) -> None:
        refusal = self._take_challenge(response)
        if refusal is None:
            self._send(now_ms, tx.expires_s)
        else:
            self._failed(now_ms, response.status, refusal, None)

    def _take_challenge(self, response: SipResponse) -> str | None:
        """Keep a 401's or 407's challenge for the next request; None, or why it cannot be answered."""
        proxy = response.status == 407
        challenge = best_challenge(response.headers_all("Proxy-Authenticate" if proxy else "WWW-Authenticate"))
        if self.config.password is None:
            return "no_credentials"
        if challenge is None:
            return "unsupported_challenge"
        if challenge.nonce in self._tried_nonces:  # answered once already: the credentials are wrong
            return "auth_rejected"
        self._tried_nonces.append(challenge.nonce)
        self._challenges["Proxy-Authorization" if proxy else "Authorization"] = (challenge, 0)
        return None

    def _too_brief(self, response: SipResponse, tx: _Register, now_ms: int) -> None:
        minimum = (response.header("Min-Expires") or "").strip()
        if self.state is RegistrationState.UNREGISTERING:
            self._unregistered(response.status)  # not for an Expires: 0, but nothing else to do
        elif minimum.isascii() and minimum.isdigit() and tx.expires_s < int(minimum) <= 2**31:
            self.expires_s = int(minimum)
            self._send(now_ms, self.expires_s)
        else:
            self._failed(now_ms, response.status, "interval_too_brief", None)

    def _failed(self, now_ms: int, status: int, reason: str, retry_after_ms: int | None) -> None:
        if self.state is RegistrationState.UNREGISTERING:
            self._unregistered(status)
            return
        self.failures += 1
        self.granted_expires_s = None
        config = self.config
        if retry_after_ms is not None:
            delay_ms = min(retry_after_ms, config.retry_max_ms)
        else:
            ceiling_ms = min(config.retry_max_ms, config.retry_base_ms * 2 ** min(self.failures - 1, 30))
            delay_ms = int(ceiling_ms * (0.5 + 0.5 * self._rand()))  # RFC 5626 §4.5: 50–100 % of the bound
        self._transition(_Trigger.FAILED, f"{status} {reason}")
        self._retry_at_ms = now_ms + delay_ms
        self._events.append(RegistrationFailed(config.aor, status, reason, delay_ms))

    def _unregistered(self, status: int) -> None:
        self._tx = None
        self._may_be_bound = False
        self.granted_expires_s = None
        self._transition(_Trigger.DONE, "unregistered")
        self._events.append(Unregistered(self.config.aor, status))

    def _granted_expires_s(self, response: SipResponse, asked_s: int) -> int:
        """Our contact's ``expires`` in the 2xx, else its ``Expires`` header, else what we asked (§10.2.4)."""
        ours = _normal_uri(self.contact)
        for value in response.headers_all("Contact"):
            for contact in split_list(value):  # Contact is a list header, read whole
                if _normal_uri(uri_of(contact)) == ours:
                    expires = split_params(contact)[1].get("expires", "")
                    if expires.isascii() and expires.isdigit():
                        return int(expires)
        header = (response.header("Expires") or "").strip()
        if header.isascii() and header.isdigit():
            return int(header)
        return asked_s

    # ------------------------------------------------------------------ sending

    def _send_removal(self, now_ms: int) -> None:
        self._removal_sent = True
        self._send(now_ms, 0)

    def _send(self, now_ms: int, expires_s: int) -> None:
        config = self.config
        self.cseq += 1
        registrar = _without_user(config.registrar)
        request = SipRequest(method="REGISTER", uri=registrar, transport=config.transport)
        host, port = config.contact_host, config.contact_port
        hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        request.add("Via", f"SIP/2.0/{config.transport} {hostport};branch=z9hG4bK{secrets.token_hex(8)};rport")
        request.add("Max-Forwards", "70")
        if config.outbound_proxy is not None:
            proxy = uri_of(config.outbound_proxy)
            request.add("Route", f"<{proxy}>" if ";lr" in proxy else f"<{proxy};lr>")
        aor = uri_of(config.aor)
        request.add("From", f"<{aor}>;tag={self.from_tag}")
        request.add("To", f"<{aor}>")
        request.add("Call-ID", self.call_id)
        request.add("CSeq", f"{self.cseq} REGISTER")
        request.add("Contact", f"<{self.contact}>")
        request.add("Expires", str(expires_s))
        request.add("Allow", ALLOW)
        request.add("User-Agent", config.user_agent)
        for header, (challenge, count) in list(self._challenges.items()):
            assert config.password is not None
            self._challenges[header] = (challenge, count + 1)
            request.add(
                header,
                authorization(
                    challenge, method="REGISTER", uri=registrar, username=config.auth_user or config.user,
                    password=config.password, cnonce=secrets.token_hex(8), nonce_count=count + 1,
                ),
            )  # fmt: skip
        data = request.serialize()
        self._tx = _Register(Retransmission.start(TxKind.REGISTER, data, config.destination, config.transport, now_ms, cseq=self.cseq), expires_s)
        self._out.append(Outgoing(data, config.destination, config.transport))

    def _transition(self, trigger: _Trigger, why: str) -> None:
        try:
            self.state = TRANSITIONS[(self.state, trigger)]
        except KeyError:
            raise RegistrationStateError(self.config.aor, self.state, f"{trigger.value} ({why})") from None


def _without_user(uri: str) -> str:
    """``sip:alice@pbx.example.com;transport=udp`` → ``sip:pbx.example.com;transport=udp`` (§10.2: the
    Request-URI of a REGISTER has no user part)."""
    bare = uri_of(uri)
    scheme, _, rest = bare.partition(":")
    return f"{scheme}:{rest.split('@', 1)[1]}" if "@" in rest else bare


def _normal_uri(uri: str) -> str:
    """A contact URI reduced for comparison: lower case, no parameters (registrars add ``transport`` or
    ``ob``)."""
    return uri.split(";", 1)[0].strip().lower()


def _retry_after_ms(response: SipResponse) -> int | None:
    """A ``Retry-After`` (§20.33: seconds, then optional comment and parameters) in ms, or None."""
    value = (response.header("Retry-After") or "").strip().split(" ", 1)[0].split(";", 1)[0].split("(", 1)[0]
    return int(value) * 1000 if value.isascii() and value.isdigit() and len(value) <= 9 else None
