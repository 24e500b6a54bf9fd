"""What ``callbridge serve`` and ``engine-server`` check before they start anything: that each listener the settings
enable can have its address, and that each optional extra the settings need is installed.

Each problem is one sentence naming the setting, what is wrong and what to do; the CLI prints it and exits (no
traceback, nothing logged as started). A listener's address is tried by binding it as its server will and letting
it go at once (the HTTP socket is kept and handed to the server), so the answer is the kernel's own.
"""

from __future__ import annotations

import errno
import importlib.util
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

from callbridge.carriers import CARRIERS
from callbridge.config import Settings

__all__ = ["ListenerProblem", "ListenerUnavailable", "bind_http", "listener_problems", "missing_extras"]

Transport = Literal["tcp", "udp"]

_ADVICE: Final = {
    errno.EADDRINUSE: "another process listens there: stop it, or choose another port",
    errno.EADDRNOTAVAIL: "no interface of this machine has that address: use one it has, or 0.0.0.0 for all",
    errno.EACCES: "ports below 1024 need privileges: choose a port of 1024 or more",
}


@dataclass(frozen=True, slots=True)
class ListenerProblem:
    """A listener whose address cannot be had: ``key`` is its port setting (``sip.port``)."""

    key: str
    host: str
    port: int
    transport: Transport
    reason: str

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.key}: cannot listen on {host}:{self.port}/{self.transport}: {self.reason}"


class ListenerUnavailable(Exception):
    """``bind_http`` could not have its address."""

    def __init__(self, problem: ListenerProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _problem(key: str, host: str, port: int, transport: Transport, exc: OSError) -> ListenerProblem:
    reason = exc.strerror or str(exc)
    advice = _ADVICE.get(exc.errno or 0)
    if isinstance(exc, socket.gaierror):
        advice = "the host name does not resolve: give an address of this machine"
    return ListenerProblem(key, host, port, transport, f"{reason.lower()} ({advice})" if advice else reason.lower())


def bind_http(key: str, host: str, port: int) -> socket.socket:
    """The HTTP listener's socket, bound and listening as uvicorn would bind it; raises ``ListenerUnavailable``."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ListenerUnavailable(_problem(key, host, port, "tcp", exc)) from None
    sock.set_inheritable(True)
    return sock


def _try_bind(key: str, host: str, port: int, transport: Transport) -> ListenerProblem | None:
    kind = socket.SOCK_STREAM if transport == "tcp" else socket.SOCK_DGRAM
    with socket.socket(_family(host), kind) as sock:
        try:
            if transport == "tcp":  # asyncio's start_server sets it; a datagram endpoint does not
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as exc:
            return _problem(key, host, port, transport, exc)
    return None


def listener_problems(settings: Settings) -> list[ListenerProblem]:
    """Each enabled listener besides HTTP (a carrier's own: ``CarrierSpec.sockets``) whose address cannot be bound
    now."""
    wanted: list[tuple[str, str, int, Transport]] = []
    for spec in CARRIERS:
        section = getattr(settings, spec.section) if spec.section is not None and spec.sockets else None
        if section is not None and section.enabled:
            wanted += [(f"{spec.section}.port", section.host, section.port, transport) for transport in spec.sockets]
            beside = getattr(section, "listeners_beside_port", None)  # a second port of its own (SIP's TLS)
            if beside is not None:
                wanted += [(f"{spec.section}.{key}", section.host, port, "tcp") for key, port in beside()]
    found = (_try_bind(*listener) for listener in wanted)
    return [problem for problem in found if problem is not None]


def file_problems(settings: Settings, now: datetime | None = None) -> list[str]:
    """One sentence for each file the settings name that cannot serve (a carrier section's ``file_problems``: SIP's
    TLS certificate unreadable, not its key's, expired)."""
    at = now or datetime.now(UTC)
    problems: list[str] = []
    for spec in CARRIERS:
        section = getattr(settings, spec.section) if spec.section is not None else None
        check = getattr(section, "file_problems", None)
        if check is not None:
            problems += check(at)
    return problems


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import; a module set to None
        return False


def missing_extras(settings: Settings) -> list[str]:
    """One sentence for each optional extra the settings need that is not installed (``pip install …[extra]``)."""
    needed: list[tuple[str, str, str]] = []  # (extra, its module, the setting that needs it)
    if settings.registry.backend == "redis":
        needed.append(("redis", "redis", 'registry.backend = "redis"'))
    if settings.engine.kind == "inline":
        needed.append(("omni", "vllm_omni", 'engine.kind = "inline"'))
    return [
        f"{setting} needs the {module} package, which is not installed: pip install 'callbridge[{extra}]'"
        for extra, module, setting in needed
        if not _installed(module)
    ]
