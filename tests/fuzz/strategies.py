"""Hypothesis strategies shared by the fuzzers: arbitrary JSON, tricky scalars, and *near-valid* messages — a
carrier's real message (the shapes its codec tests and simulator send) with fields deleted, retyped, made huge,
or its base64 broken — in sequences of any order (media before start, start twice, stop then media…)."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Sequence
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

__all__ = [
    "TRICKY",
    "budget",
    "json_text",
    "json_values",
    "messages",
    "mutated",
    "near_valid_text",
    "sequences",
]


def budget(fraction: float, floor: int = 10) -> settings:
    """A share of the loaded profile's ``max_examples`` (``ci`` or ``deep``), for the slower fuzzers."""
    return settings(max_examples=max(floor, int(settings.default.max_examples * fraction)))


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=20,
)
"""Any JSON value (numbers beyond 64 bits included: they reach the codecs as floats through orjson)."""

TRICKY: Sequence[Any] = (
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**63,
    -(2**63),
    2**64,
    10**30,
    -(10**30),
    0.5,
    -0.0,
    1e308,
    -1e308,
    "",
    " ",
    "0",
    "-1",
    "+5",
    "1e3",
    "0x10",
    "1_000",
    "²",
    "٣",
    "8000",
    "16000",
    "NaN",
    "null",
    "\x00",
    "ß",
    "ǅ",
    "\u0130",
    "a" * 300,
    "=",
    "====",
    "AAA",
    "A===",
    "/////w==",
    "/////w==\n",
    "////\u00ff",
    "%%",
    "[]",
    "{}",
    [],
    {},
    [None],
    {"": None},
    ["8000"],
    {"x": {"y": {"z": [1, 2, 3]}}},
)
"""Values that have broken parsers: wrong types, unicode digits (``"²".isdigit()`` is True, ``int("²")``
raises), case mappings that change length (``"ß".upper() == "SS"``), huge and negative numbers, bad base64."""

_tricky = st.sampled_from(TRICKY).map(copy.deepcopy)  # a fresh copy: mutations must not change TRICKY itself
_replacement = _tricky | json_values | st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode())


@st.composite
def _mutate_once(draw: st.DrawFn, value: Any) -> Any:
    """One change somewhere in ``value``: a node (chosen by walking down at random) deleted, replaced by a wrong
    value, or given an extra key."""
    if isinstance(value, dict | list) and value and draw(st.integers(0, 3)) > 0:
        keys = sorted(value) if isinstance(value, dict) else list(range(len(value)))
        key = draw(st.sampled_from(keys))
        action = draw(st.sampled_from(("descend", "descend", "delete", "replace")))
        if action == "delete":
            del value[key]
        elif action == "replace":
            value[key] = draw(_replacement)
        else:
            value[key] = draw(_mutate_once(value[key]))
        return value
    if isinstance(value, dict) and draw(st.booleans()):
        value[draw(st.text(max_size=10))] = draw(_replacement)
        return value
    return draw(_replacement)


@st.composite
def mutated(draw: st.DrawFn, template: Any, max_changes: int = 3) -> Any:
    """``template`` (a JSON value) with up to ``max_changes`` changes; often none, so the valid path is walked too."""
    value = copy.deepcopy(template)
    for _ in range(draw(st.integers(0, max_changes))):
        value = draw(_mutate_once(value))
    return value


def _dumps(value: Any, ascii_only: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"))


json_text = st.builds(_dumps, json_values, st.booleans())
"""Arbitrary JSON as websocket text (any value, not only objects)."""


@st.composite
def near_valid_text(draw: st.DrawFn, templates: Sequence[Any], max_changes: int = 3) -> str:
    """One of a carrier's messages, perhaps mutated, as text."""
    return _dumps(draw(mutated(draw(st.sampled_from(templates)), max_changes)), draw(st.booleans()))


def messages(
    templates: Sequence[Any], *, binary: st.SearchStrategy[bytes] | None = None, max_changes: int = 3
) -> st.SearchStrategy[str | bytes]:
    """One message: mostly a near-valid message of the carrier (or one of its binary frames), sometimes arbitrary
    JSON, text or bytes."""
    noise: st.SearchStrategy[str | bytes] = json_text | st.text(max_size=50) | st.binary(max_size=50)
    message: st.SearchStrategy[str | bytes] = near_valid_text(templates, max_changes)
    if binary is not None:
        message = message | binary
    return st.one_of(message, message, message, noise)


def sequences(
    templates: Sequence[Any], *, binary: st.SearchStrategy[bytes] | None = None, max_size: int = 12
) -> st.SearchStrategy[list[str | bytes]]:
    """Message sequences (see ``messages``) in any order: media before start, start twice, stop then media…"""
    return st.lists(messages(templates, binary=binary), max_size=max_size)
