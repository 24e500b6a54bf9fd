"""Who a simulated carrier's outbound call reaches (#42): a person who answers after some rings and then acts as a
``CallerScript`` says (from the answer), or a line that is busy, rings out unanswered, or fails. A simulator that
takes REST dials keeps them by number (``callees``); a number not listed reaches ``Callee()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from callbridge.sim.caller import CallerScript

__all__ = ["Callee", "CalleeOutcome"]

CalleeOutcome = Literal["answers", "busy", "no_answer", "fails"]


@dataclass(frozen=True, slots=True)
class Callee:
    """``outcome``: ``answers`` after ``ring_ms`` (the script's times count from the answer); ``busy`` and ``fails``
    after ``ring_ms``; ``no_answer`` rings until the dial's own timeout."""

    outcome: CalleeOutcome = "answers"
    ring_ms: int = 1000
    script: CallerScript = field(default_factory=lambda: CallerScript(hangup_at_ms=3000))
