"""What the app (its lifespan, ``/readyz``, SIGTERM's drain) uses of its process's place in the fleet — the port the
app holds (``BridgeState.fleet``), not the whole ``BridgeServices``: whether the process takes new calls and why
not, the calls it carries, the drain, and the signals other processes send about calls whose stream is here."""

from __future__ import annotations

from typing import Protocol

__all__ = ["FleetPort"]


class FleetPort(Protocol):
    """The process among its fleet, as the app drives it (``BridgeServices``)."""

    draining: bool
    """SIGTERM has come: no new call is admitted (``/readyz`` says so)."""

    @property
    def active_calls(self) -> set[str]: ...

    async def unready_because(self) -> str | None:
        """Why no new call should be sent here now (``/readyz`` 503), or None."""
        ...

    def readiness_answered(self, reason: str | None) -> None:
        """``/readyz`` answered a check (draining: what takes the process out of the load balancer)."""
        ...

    async def drain(self, timeout_s: float) -> None:
        """Refuse new calls; move or serve out the ones carried, for up to ``timeout_s``."""
        ...

    def start_listening(self) -> None:
        """Take other processes' signals about calls whose stream is here (from the app's start)."""
        ...
