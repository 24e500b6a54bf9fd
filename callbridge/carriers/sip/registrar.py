"""The asyncio driver of the REGISTER clients (``sip.registrations``): one ``SipRegistration`` core per
registration, its REGISTERs sent from the SIP listener's own UDP socket, so that the registrar binds the address
it will send INVITEs to (``transport = "tcp"``: over a connection the listener opens and reads like the ones it
accepts; the Contact says ``;transport=tcp``; ``"tls"``: the same over TLS, to port 5061 where the registrar's URI
names none, its certificate checked against the URI's host name, our Contact the TLS port with ``;transport=tls``).

The listener hands every SIP response it receives to ``receive`` first (a
response whose Call-ID is one of ours is taken, others go to the UAS), starts
the clients once its socket is bound and stops them before it closes: each
binding is removed with ``Expires: 0``, waited for at most
``_UNREGISTER_WAIT_S``. A drain (``services.desk.draining``) removes the bindings
too, so that the PBX sends its next calls elsewhere.

The contact is ``sip.public_address``, else ``sip.host``; a wildcard host
(``0.0.0.0``) is replaced by the local address the system routes to the
registrar from. Names are resolved here (A/AAAA; no SRV/NAPTR), again at each
retry after a failure to resolve.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Final

from callbridge.bridge.metrics import BridgeMetrics
from callbridge.carriers.sip.settings import SipRegistrationSettings
from callbridge.carriers.sip.tls import TlsPeer
from callbridge.logging import get_logger
from callbridge.sip.message import SipParseError, SipResponse, parse_message, uri_of
from callbridge.sip.registration import (
    Registered,
    RegistrationConfig,
    RegistrationFailed,
    RegistrationState,
    SipRegistration,
    Unregistered,
)
from callbridge.sip.transaction import Outgoing

__all__ = ["RegistrationClients", "sip_target"]

log = get_logger(__name__)

_UNREGISTER_WAIT_S: Final = 2.0
_DRAIN_POLL_S: Final = 1.0


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def sip_target(uri: str, default_port: int = 5060) -> tuple[str, int]:
    """``sip:user@host:port;params`` → (host, port); ``default_port`` when absent."""
    bare = uri_of(uri).split(";", 1)[0]
    rest = bare.split(":", 1)[1] if ":" in bare else bare
    hostport = rest.rsplit("@", 1)[-1]
    if hostport.startswith("["):
        host, _, tail = hostport[1:].partition("]")
        port = tail.lstrip(":")
    else:
        host, _, port = hostport.partition(":")
    return host, int(port) if port.isdigit() and 0 < int(port) <= 65535 else default_port


class _Client:
    """One registration: resolving, then driving its core until stopped."""

    def __init__(self, owner: RegistrationClients, settings: SipRegistrationSettings) -> None:
        self.owner = owner
        self.settings = settings
        self.core: SipRegistration | None = None
        self.wake = asyncio.Event()
        self.stopping = False
        self.done = asyncio.Event()
        self.registered_count = 0
        """Successful REGISTERs (the first and each refresh), for tests and logs."""
        self.failures: list[RegistrationFailed] = []

    @property
    def aor(self) -> str:
        return self.settings.aor

    async def run(self) -> None:
        try:
            core = await self._resolve()
            if core is None:
                return
            self.core = core
            core.start(_now_ms())
            self.drain()
            while core.state is not RegistrationState.STOPPED:
                if not self.stopping and self.owner.draining():
                    self.stop()
                deadline = core.next_deadline_ms()
                timeout_s = _DRAIN_POLL_S if deadline is None else max(0.0, min(_DRAIN_POLL_S, (deadline - _now_ms()) / 1000))
                with suppress(TimeoutError):
                    async with asyncio.timeout(timeout_s):
                        await self.wake.wait()
                self.wake.clear()
                core.tick(_now_ms())
                self.drain()
        except Exception:  # a bug here must not take the listener down: this registration alone stops
            log.exception("sip_registration_crashed", aor=self.aor)
        finally:
            self.owner.set_state(self.aor, RegistrationState.STOPPED)
            self.done.set()

    async def _resolve(self) -> SipRegistration | None:
        """The core, once the registrar (or proxy) resolves; None when stopped first."""
        settings = self.settings
        host, port = sip_target(settings.outbound_proxy or settings.registrar, 5061 if settings.transport == "tls" else 5060)
        delay_s = settings.retry_base_s
        while not self.stopping:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM if settings.transport == "udp" else socket.SOCK_STREAM)
                address = (str(infos[0][4][0]), int(infos[0][4][1]))
                break
            except (OSError, IndexError) as exc:
                self.owner.metrics.sip_registration_failures.labels(self.aor, "dns").inc()
                log.warning("sip_registration_failed", aor=self.aor, reason="dns", host=host, error=str(exc), retry_in_s=delay_s)
                with suppress(TimeoutError):
                    async with asyncio.timeout(delay_s):
                        await self.wake.wait()
                delay_s = min(delay_s * 2, settings.retry_max_s)
        else:
            return None
        contact_host, contact_port = self.owner.contact_for(address, tls=settings.transport == "tls")
        if settings.transport == "tls":  # its certificate is checked against the name, not the address
            self.owner.tls_peers[address] = TlsPeer(host.strip("[]"), settings.tls_ca_file)
        password = settings.password.get_secret_value() if settings.password is not None else None
        return SipRegistration(
            RegistrationConfig(
                registrar=settings.registrar, aor=settings.aor, destination=address, contact_host=contact_host,
                contact_port=contact_port, auth_user=settings.auth_user, password=password, expires_s=settings.expires_s,
                outbound_proxy=settings.outbound_proxy, retry_base_ms=int(settings.retry_base_s * 1000),
                retry_max_ms=int(settings.retry_max_s * 1000), transport=settings.transport.upper(),
            )
        )  # fmt: skip

    def drain(self) -> None:
        core = self.core
        if core is None:
            return
        for out in core.datagrams_to_send():
            self.owner.send(out)
        metrics = self.owner.metrics
        for event in core.events():
            match event:
                case Registered(aor, expires_s, refresh_in_ms):
                    self.registered_count += 1
                    log.info("sip_registered", aor=aor, expires_s=expires_s, refresh_in_s=refresh_in_ms / 1000, contact=core.contact)
                case RegistrationFailed(aor, status, reason, retry_in_ms):
                    self.failures.append(event)
                    metrics.sip_registration_failures.labels(aor, reason).inc()
                    log.warning("sip_registration_failed", aor=aor, status=status, reason=reason, retry_in_s=retry_in_ms / 1000)
                case Unregistered(aor, status):
                    log.info("sip_unregistered", aor=aor, status=status)
        self.owner.set_state(self.aor, core.state)

    def stop(self) -> None:
        self.stopping = True
        if self.core is not None:
            self.core.stop(_now_ms())
            self.drain()
        self.wake.set()


class RegistrationClients:
    """Every registration of one SIP listener. ``send`` writes one datagram on the listener's socket."""

    def __init__(
        self,
        registrations: list[SipRegistrationSettings],
        metrics: BridgeMetrics,
        send: Callable[[Outgoing], None],
        draining: Callable[[], bool],
        tls_peers: dict[tuple[str, int], TlsPeer] | None = None,
    ) -> None:
        self.metrics = metrics
        self.send = send
        self.draining = draining
        self.tls_peers: dict[tuple[str, int], TlsPeer] = {} if tls_peers is None else tls_peers
        """The listener's: where a registrar over TLS is, the name its certificate must bear."""
        self.clients = [_Client(self, settings) for settings in registrations]
        self._tasks: list[asyncio.Task[None]] = []
        self._contact: tuple[str, int] = ("127.0.0.1", 5060)
        self._tls_port: int | None = None

    def start(self, contact_host: str, contact_port: int, tls_port: int | None = None) -> None:
        """Begin registering, with ``contact_host``:``contact_port`` (the listener's address) as our contact, or
        ``tls_port`` (the listener's TLS port, where it has one) for a registration over TLS."""
        self._contact = (contact_host, contact_port)
        self._tls_port = tls_port
        for client in self.clients:
            self.set_state(client.aor, RegistrationState.IDLE)
            self._tasks.append(asyncio.create_task(client.run()))

    def receive(self, data: bytes) -> bool:
        """A datagram (or a message cut from a TCP stream) that came to the listener: True when it was a response to one of our REGISTERs (taken),
        False for anything else (the UAS's)."""
        if not self.clients or not data.startswith(b"SIP/2.0 "):
            return False
        try:
            response = parse_message(data)
        except SipParseError:
            return False
        if not isinstance(response, SipResponse):
            return False
        for client in self.clients:
            if client.core is not None and client.core.receive_response(response, _now_ms()):
                client.drain()
                client.wake.set()
                return True
        return False

    async def stop(self) -> None:
        """Remove every binding (``Expires: 0``) and wait for the answers, at most ``_UNREGISTER_WAIT_S``."""
        for client in self.clients:
            client.stop()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=_UNREGISTER_WAIT_S)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def contact_for(self, destination: tuple[str, int], *, tls: bool = False) -> tuple[str, int]:
        """Our contact address for a registrar at ``destination``: the listener's (its TLS port for a registration
        over TLS, where it has one), a wildcard host replaced by the local address routed to it (a connected UDP
        socket sends nothing)."""
        host, port = self._contact
        if tls and self._tls_port is not None:
            port = self._tls_port
        with suppress(ValueError):
            if ipaddress.ip_address(host).is_unspecified:
                family = socket.AF_INET6 if ":" in destination[0] else socket.AF_INET
                with socket.socket(family, socket.SOCK_DGRAM) as probe, suppress(OSError):
                    probe.connect(destination)
                    host = str(probe.getsockname()[0])
        return host, port

    def set_state(self, aor: str, state: RegistrationState) -> None:
        for each in RegistrationState:
            self.metrics.sip_registration_state.labels(aor, each.value).set(1 if each is state else 0)
