"""SIP over TLS (#43): the listener's server certificate, read again when its files change.

Why not asyncio's ``start_server(ssl=…)``: its handshake runs before the server's callback, for any source, with no
bound on how many are under way. The listener accepts plain TCP, refuses a source that could never place a call
(outside ``sip.allowed_ips`` with no digest credentials configured) and any connection past
``sip.max_tls_connections`` before a byte of TLS, then upgrades (``StreamWriter.start_tls``) within
``sip.tls_handshake_timeout_s``.

The certificate: one ``ssl.SSLContext`` (TLS 1.2 at least, the ``ssl`` module's default ciphers), its chain loaded
from ``sip.tls_certificate`` and ``sip.tls_private_key``. Before each handshake ``refresh`` looks at both files'
modification times and sizes; where either changed it loads them into a new context, which the handshakes from
then on use (those under way keep theirs): a renewed certificate (certbot, cert-manager) takes effect without a
restart. A pair that cannot be read, or whose key does not match, leaves the one in use and is logged once per
change; at the start it is an error (``callbridge config check`` says why too).

Mutual TLS: where ``sip.tls_client_ca_file`` is set the context asks every peer for a certificate that chains to
those CAs (``CERT_REQUIRED``): a peer without one fails its handshake. The CA file is watched with the pair. The
connections we open (a trunk's, a registrar's: ``client_context``) present ``sip.tls_certificate`` where it is
set, for the peer that asks for it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography import x509

from callbridge.logging import get_logger

__all__ = ["TlsAcceptor", "TlsCertificate", "TlsCertificateError", "TlsPeer", "ca_file_problems", "certificate_problems", "client_context"]

StreamServer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]]
"""What serves a connection once it is TLS: the listener's reader of SIP messages on a stream (its transport)."""

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class TlsPeer:
    """A peer we open TLS to (a trunk, a registrar): the name its certificate must bear (the host name its address
    was resolved from) and the CAs it must chain to (None: the system's)."""

    name: str
    ca_file: Path | None = None


class TlsCertificateError(Exception):
    """The certificate or its key cannot be read, or do not belong together."""


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


class TlsCertificate:
    """The server side of SIP over TLS: ``context`` for the next handshake (see the module docstring)."""

    def __init__(self, certificate: Path, private_key: Path, client_ca_file: Path | None = None) -> None:
        self.certificate = certificate
        self.private_key = private_key
        self.client_ca_file = client_ca_file
        """Mutual TLS: the CAs a peer's certificate must chain to (None: none is asked for)."""
        self._stamps: tuple[tuple[int, int], ...] | None = self._read_stamps()
        """The files' times and sizes at the last look (None: they could not be read then)."""
        self.context = self._load()
        self.reloads = 0

    def refresh(self) -> bool:
        """Load the files again where they changed since the last look; True when a new certificate is in use."""
        try:
            stamps: tuple[tuple[int, int], ...] | None = self._read_stamps()
        except OSError as exc:  # gone (being replaced, perhaps): the one in use serves on; said once
            if self._stamps is not None:
                log.warning("sip_tls_certificate_unreadable", path=str(self.certificate), detail=str(exc)[:200])
            stamps = None
        if stamps is None or stamps == self._stamps:
            self._stamps = stamps
            return False
        self._stamps = stamps  # a pair that fails is not tried again until it changes again
        try:
            self.context = self._load()
        except TlsCertificateError as exc:
            log.warning("sip_tls_certificate_unreadable", path=str(self.certificate), detail=str(exc)[:200])
            return False
        self.reloads += 1
        log.info("sip_tls_certificate_reloaded", path=str(self.certificate))
        return True

    def _read_stamps(self) -> tuple[tuple[int, int], ...]:
        files = (self.certificate, self.private_key) if self.client_ca_file is None else (self.certificate, self.private_key, self.client_ca_file)
        return tuple(_stamp(path) for path in files)

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.certificate, self.private_key)
        except (OSError, ssl.SSLError) as exc:
            raise TlsCertificateError(f"{self.certificate} with {self.private_key}: {exc}") from exc
        if self.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise TlsCertificateError(f"{self.client_ca_file}: {exc}") from exc
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def client_context(ca_file: Path | None, certificate: tuple[Path, Path] | None) -> ssl.SSLContext:
    """The context of a connection we open (to a trunk, a registrar): the peer's certificate checked against its
    host name, chained to ``ca_file``'s CAs (None: the system's); ``certificate`` (ours, with its key) presented to
    a peer that asks for one. Ours unreadable (mid-renewal): logged, and the connection goes without it."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if certificate is not None:
        try:
            context.load_cert_chain(*certificate)
        except (OSError, ssl.SSLError) as exc:
            log.warning("sip_tls_certificate_unreadable", path=str(certificate[0]), detail=str(exc)[:200], side="client")
    return context


def _pem_certificates(path: Path) -> list[x509.Certificate] | str:
    """The PEM certificates in ``path``, or why there are none, in a sentence."""
    try:
        return x509.load_pem_x509_certificates(path.read_bytes())
    except OSError as exc:
        return f"{path} cannot be read: {exc.strerror or exc}"
    except ValueError:
        return f"{path} holds no PEM certificate"


def ca_file_problems(path: Path, now: datetime) -> list[str]:
    """What is wrong with a file of CA certificates, one sentence each: unreadable, no PEM certificate in it, or
    every certificate in it expired at ``now``."""
    certificates = _pem_certificates(path)
    if isinstance(certificates, str):
        return [certificates]
    last = max(each.not_valid_after_utc for each in certificates)
    if last <= now:
        return [f"every certificate in {path} expired, the last on {last:%Y-%m-%d %H:%M} UTC"]
    return []


def certificate_problems(certificate: Path, private_key: Path, now: datetime) -> list[str]:
    """What is wrong with a certificate and its key, one sentence each (``callbridge config check``, and ``serve``
    before it starts): unreadable, not PEM, its key not its own, expired or not valid yet at ``now``."""
    chain = _pem_certificates(certificate)
    if isinstance(chain, str):
        return [chain]
    try:
        TlsCertificate(certificate, private_key)
    except TlsCertificateError as exc:
        return [f"{private_key} is not the key of {certificate}, or cannot be read: {exc.__cause__ or exc}"]
    leaf, problems = chain[0], []
    if leaf.not_valid_after_utc <= now:
        problems.append(f"{certificate} expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    if leaf.not_valid_before_utc > now:
        problems.append(f"{certificate} is not valid before {leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    return problems


class TlsAcceptor:
    """The TLS port: plain TCP accepted, then refused or upgraded (see the module docstring); an upgraded connection
    is served like a TCP one (``serve``, transport ``TLS``). ``dropped`` counts what it refused, by reason."""

    def __init__(
        self,
        certificate: TlsCertificate,
        *,
        may_call: Callable[[str], bool],
        serve: StreamServer,
        dropped: Counter[str],
        max_connections: int,
        handshake_timeout_s: float,
    ) -> None:
        self.certificate = certificate
        self._may_call = may_call
        self._serve = serve
        self._dropped = dropped
        self._max_connections = max_connections
        self._handshake_timeout_s = handshake_timeout_s
        self.open = 0
        """Connections accepted and not closed (their handshake under way, or served)."""
        self.served = 0
        """Connections upgraded to TLS and served, ever."""
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int | None:
        if self._server is None or not self._server.sockets:
            return None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._accepted, host, port)

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        with suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await self._server.wait_closed()
        self._server = None

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        refused = None
        if self.open >= self._max_connections:
            refused = "tls_too_many_connections"
        elif not self._may_call(str(peer[0])):
            refused = "tls_source_not_allowed"
        if refused is not None:
            self._dropped[refused] += 1
            writer.close()
            return
        self.open += 1
        try:
            self.certificate.refresh()
            try:
                async with asyncio.timeout(self._handshake_timeout_s):
                    await writer.start_tls(self.certificate.context)
            except (ssl.SSLError, OSError, TimeoutError) as exc:
                self._dropped["tls_handshake_failed"] += 1
                log.debug("sip_tls_handshake_failed", peer=str(peer[0]), detail=repr(exc)[:200])  # counted: anyone can cause one
                writer.close()
                return
            self.served += 1
            if (peer_certificate := writer.get_extra_info("peercert")) is not None:  # mutual TLS: verified
                log.debug("sip_tls_peer_certificate", peer=str(peer[0]), subject=_subject(peer_certificate))
            await self._serve(reader, writer, "TLS")
        finally:
            self.open -= 1


def _subject(certificate: dict[str, Any]) -> str:
    """A verified peer certificate's subject (``ssl.SSLSocket.getpeercert``'s form: relative names, each a tuple of
    (key, value) pairs), ``commonName=…, organizationName=…``."""
    return ", ".join(f"{key}={value}" for rdn in certificate.get("subject", ()) for key, value in rdn)
