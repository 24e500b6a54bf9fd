"""The engine a bridge process opens its calls' sessions on, as ``engine.kind`` names it."""

from __future__ import annotations

from callbridge.config import Settings
from callbridge.engine.errors import EngineError, ErrorCode
from callbridge.engine.pool import EnginePool
from callbridge.engine.port import DuplexEngine

__all__ = ["build_engine"]


def build_engine(settings: Settings) -> DuplexEngine:
    """The engine ``engine.kind`` names: embedded (default), vllm-omni over websockets, or in process."""
    kind = settings.engine.kind
    if kind == "local":
        from callbridge.engine.local.engine import LocalEngine
        from callbridge.engine.server import local_engine_options

        return LocalEngine(local_engine_options(settings))
    if kind == "realtime":  # one server or several: a pool (least loaded, failover, ejection, drain)
        engine = settings.engine
        if not engine.urls:
            raise EngineError(ErrorCode.INVALID_SESSION_CONFIG, "engine.kind = realtime needs engine.urls")
        return EnginePool(
            engine.urls,
            api_key=engine.api_key.get_secret_value() if engine.api_key else None,
            reconnect_budget_s=engine.reconnect_budget_s,
            liveness_interval_s=engine.liveness_interval_s,
            liveness_timeout_s=engine.liveness_timeout_s,
            heartbeat_interval_s=engine.heartbeat_interval_s,
            eject_after_failures=engine.eject_after_failures,
            probe_interval_s=engine.probe_interval_s,
            probe_backoff_max_s=engine.probe_backoff_max_s,
            probe_timeout_s=engine.probe_timeout_s,
        )
    from callbridge.engine.inline import InlineEngine

    return InlineEngine.create(settings.engine.model or "")
