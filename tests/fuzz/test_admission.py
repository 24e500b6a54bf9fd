"""Exotel's Basic credentials check, fuzzed: any ``Authorization`` header (starlette hands it over decoded as
latin-1) is refused or admitted, never an exception (a 500 on the upgrade); only the configured pair admits."""

from __future__ import annotations

import base64

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import SecretStr

from callbridge.carriers.exotel.http import ExotelAdmission
from callbridge.carriers.webhooks import BasicCredentials

pytestmark = [pytest.mark.hot_path, pytest.mark.background]
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""

ADMISSION = ExotelAdmission(validate_credentials=True, credentials=BasicCredentials("key", SecretStr("token")))
_latin1 = st.binary(max_size=40).map(lambda b: b.decode("latin-1"))
_basic = st.builds(
    lambda user, password: "Basic " + base64.b64encode(user + b":" + password).decode(),
    st.binary(max_size=8),
    st.binary(max_size=8),
)


@given(header=st.none() | _latin1 | _latin1.map("Basic ".__add__) | _basic)
@example(header="Basic \u00ff\u00ff")  # not ASCII: a2b_base64 raised ValueError, not binascii.Error
def test_any_authorization_header_is_refused_or_admitted(header: str | None) -> None:
    refusal = ADMISSION.refusal(header, "203.0.113.9")
    good = "Basic " + base64.b64encode(b"key:token").decode()
    assert refusal is None if header == good else refusal == "bad_credentials"
