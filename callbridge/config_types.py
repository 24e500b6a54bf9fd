"""The value types settings are made of, checked when they load: ports, URLs by scheme, networks, hosts, transfer
targets, key files; and ``Section``, what every settings section is. ``callbridge.config`` composes them, and a
carrier's package defines its own section with them (``callbridge/carriers/<name>/settings.py``)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr

__all__ = [
    "Host",
    "HttpUrl",
    "Network",
    "Port",
    "Section",
    "TransferTarget",
    "url_check",
    "whole_number",
]

Port = Annotated[int, Field(ge=1, le=65535)]


def whole_number(value: Any) -> Any:
    """A whole number given as text (an env var, ``--set``) as the int it names, so that an integer ``Literal``
    takes ``"8000"`` as TOML's ``8000``; anything else as it came (the Literal then refuses it)."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value


def url_check(*schemes: str) -> AfterValidator:
    """A URL with one of ``schemes`` and a host (``ws://host:port``): refused at load, not at the first call."""

    def check(value: Any) -> Any:
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError as exc:
            raise ValueError(f"not a URL ({exc})") from None
        if parts.scheme not in schemes:
            raise ValueError("needs a URL starting " + " or ".join(f"{scheme}://" for scheme in schemes))
        if not parts.hostname and parts.scheme != "unix":
            raise ValueError(f"needs a host ({schemes[0]}://host:port)")
        return value

    return AfterValidator(check)


HttpUrl = Annotated[str, url_check("https", "http")]
"""An http(s) base URL, kept as the text given (a trailing slash or path is the user's)."""


def _network(value: str) -> str:
    import ipaddress

    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError("not an IP address or CIDR (203.0.113.0/24, 2001:db8::/32)") from None
    return value


Network = Annotated[str, AfterValidator(_network)]
"""An address or CIDR whose peers are admitted, checked at load (not when the listener starts)."""

_HOSTNAME: Final = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")


def _host(value: str) -> str:
    import ipaddress

    try:
        ipaddress.ip_address(value)
    except ValueError:
        if not _HOSTNAME.match(value):
            raise ValueError("neither an IP address nor a host name") from None
    return value


Host = Annotated[str, AfterValidator(_host)]
"""An IP address or a DNS host name (RFC 1123), as SIP's Contact and SDP's ``c=`` carry it."""

_PHONE_NUMBER: Final = re.compile(r"^\+?[0-9]{2,20}$")


def _transfer_target(value: str) -> str:
    if value.lower().startswith(("sip:", "sips:")) and len(value.split(":", 1)[1]) > 0:
        return value
    if _PHONE_NUMBER.match(value):
        return value
    raise ValueError("neither a phone number (+15550100) nor a SIP URI (sip:frontdesk@pbx.example.com)")


TransferTarget = Annotated[str, AfterValidator(_transfer_target)]


class Section(BaseModel):
    """A settings section: unknown keys are errors, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
