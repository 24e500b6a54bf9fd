"""Admission by source address: is a peer in one of the configured networks (CIDRs)?"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

__all__ = ["Network", "source_allowed"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def source_allowed(host: str | None, networks: Iterable[Network]) -> bool:
    """Whether a peer address lies in one of ``networks`` (an IPv4-mapped IPv6 peer counts as its IPv4); False
    for no address or one that does not parse."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)
