"""The registry ``registry.backend`` names: in memory (one process), or Redis (a fleet)."""

from __future__ import annotations

from callbridge.bridge.registry import CallRegistry, MemoryCallRegistry, MemoryStreamTokens, StreamTokens
from callbridge.config import Settings

__all__ = ["build_registry"]


def build_registry(settings: Settings) -> tuple[CallRegistry, StreamTokens]:
    """The registry and tokens ``registry.backend`` names. Redis needs the ``redis`` extra and
    ``registry.redis_url``; the tokens share the registry's connection pool (closed by ``registry.aclose()``)."""
    if settings.registry.backend == "redis":
        from callbridge.bridge.registry_redis import redis_registry

        return redis_registry(settings)
    return MemoryCallRegistry(), MemoryStreamTokens()
