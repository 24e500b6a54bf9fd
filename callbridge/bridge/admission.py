"""Admission, the pure part: which calls this process holds, and whether one more may be answered.

A call is *held* from the moment its answer is admitted (``take``), so a burst of answers cannot all pass before any
of them is counted, until its stream binds (``bound``: it is then *bridged*) or its slot lapses (``hold_s`` after the
answer, when no stream came) or goes back (``give_back``: refused after all). ``server.max_calls`` counts both; a
call already held or bridged is never refused (a stream coming back). Time comes from outside (``now``, seconds on
a monotonic clock); the fleet's count (``server.max_calls_fleet``) and the registry are the caller's
(``AnswerDesk.admits``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["AdmissionBook", "Refusal"]

_ROUNDING_PERCENT = 1e-6
"""A projection that fills the budget exactly (``max_calls`` calls at the guess) is within it, whatever the float's
last digit says."""


class Refusal(enum.Enum):
    """Why a call was not admitted (the ``callbridge_admission_refused_total`` label)."""

    CPU_BUDGET = "cpu_budget"
    MAX_CALLS = "max_calls"
    MAX_CALLS_FLEET = "max_calls_fleet"
    ENGINE = "engine"


@dataclass
class AdmissionBook:
    max_calls: int
    cpu_budget_percent: float = 0.0
    """0: no CPU budget."""
    hold_s: float = 30.0
    """How long an admitted call's slot is held for its stream (``engine.open_at_answer_ttl_s``)."""
    bridged: set[str] = field(default_factory=set)
    """Calls whose stream bound its engine session here."""
    admitted: dict[str, float] = field(default_factory=dict)
    """Calls admitted here whose stream has not bound yet: call id → when the slot lapses."""

    def take(self, call_id: str, now: float, cpu_percent: float) -> Refusal | None:
        """Admit ``call_id`` and hold its slot, or say why not. A call held or bridged already is taken again."""
        if call_id in self.bridged or call_id in self.admitted:
            return None
        if self.held(now) >= self.max_calls:  # first: where both refuse, the configured limit is the reason
            return Refusal.MAX_CALLS
        if self.cpu_budget_percent and cpu_percent > self.cpu_budget_percent + _ROUNDING_PERCENT:
            return Refusal.CPU_BUDGET
        if call_id:
            self.admitted[call_id] = now + self.hold_s
        return None

    def knows(self, call_id: str) -> bool:
        return call_id in self.bridged or call_id in self.admitted

    def held(self, now: float) -> int:
        """Calls bridged here, and calls admitted here whose stream is still to come (lapsed slots let go)."""
        for call_id in [c for c, until in self.admitted.items() if until <= now]:
            del self.admitted[call_id]
        return len(self.bridged) + len(self.admitted)

    def holding(self) -> list[str]:
        """Every call counted here: bridged, and admitted with its stream still to come."""
        return [*self.bridged, *self.admitted]

    def give_back(self, call_id: str) -> bool:
        """An admitted call was refused after all (no engine took it, the registry failed): its slot goes back.
        True when it held one."""
        return self.admitted.pop(call_id, None) is not None

    def bound(self, call_id: str) -> None:
        """The call's stream bound its engine session here: bridged, no longer only admitted."""
        self.bridged.add(call_id)
        self.admitted.pop(call_id, None)

    def unbound(self, call_id: str) -> None:
        """The call's stream here ended (the call may go on elsewhere, or be over)."""
        self.bridged.discard(call_id)
