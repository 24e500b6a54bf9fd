"""What a simulated carrier accepts as the target of a transfer at the answer (``<Dial>``, ``connect``, ``dial``,
``<Transfer>``, a SIP ``302``): an E.164 number or a SIP URI, as the real carriers do."""

from __future__ import annotations

import re
from typing import Final

from callbridge.sim.carrier import CallResult

__all__ = ["sent_on"]

_TARGET: Final = re.compile(r"(\+[1-9][0-9]{6,14}|sips?:[^\s<>]{3,250})")


def sent_on(result: CallResult, at_ms: int, provider: str, how: str, target: object) -> None:
    """The answer sent the call on to ``target`` by ``how``: logged and kept, or a warning where the carrier would
    refuse the target."""
    if not isinstance(target, str) or not _TARGET.fullmatch(target):
        result.warnings.append(f"{how}: a target {provider} cannot dial: {target!r}")
        return
    result.transferred_to = target
    result.log(at_ms, provider, f"{how} to {target}: the call leaves the bridge")
