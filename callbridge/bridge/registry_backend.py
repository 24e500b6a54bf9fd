"""The registry ``registry.backend`` names: in memory (one process, or a ``serve --workers`` group's, held by its
supervisor), or Redis (a fleet)."""

from __future__ import annotations

from callbridge.bridge.registry import CallRegistry, MemoryCallRegistry, MemoryStreamTokens, StreamTokens
from callbridge.bridge.registry_host import HostAddress, hosted_registry
from callbridge.config import Settings

__all__ = ["build_registry"]


def build_registry(settings: Settings, host: HostAddress | None = None) -> tuple[CallRegistry, StreamTokens]:
    """The registry and tokens ``registry.backend`` names. Redis needs the ``redis`` extra and
    ``registry.redis_url``; the tokens share the registry's connection pool (closed by ``registry.aclose()``).
    ``host``: a ``serve --workers`` worker's group registry, where the backend is memory (``registry_host``)."""
    if settings.registry.backend == "redis":
        from callbridge.bridge.registry_redis import redis_registry

        return redis_registry(settings)
    if host is not None:
        return hosted_registry(host)
    return MemoryCallRegistry(), MemoryStreamTokens()
