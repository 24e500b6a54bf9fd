"""The HTTP clients callbridge sends with (carriers' REST APIs, the application's webhooks, recording uploads,
engine probes, the simulated carriers) share one TLS context per process.

httpx builds a TLS context for every client it makes, loading the whole CA bundle: about 18 ms of CPU each (measured:
``python -m cProfile`` over ``tests/bridge/test_carrier_matrix.py``, 619 contexts, 11.2 s), though most of these
clients never open an ``https://`` URL. A bridge made seven at startup, an engine probe one per probe, a recording
upload one per upload. One context, made on first use as httpx makes it (``SSL_CERT_FILE`` / ``SSL_CERT_DIR``, else
certifi's bundle), serves every client: an ``ssl.SSLContext`` is shared safely between connections.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx

__all__ = ["http_client", "response_object", "tls_context"]


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's TLS context for outbound HTTPS (httpx's own default: the environment's bundle, else certifi's)."""
    return httpx.create_ssl_context()


def http_client(**options: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` with ``options``, verifying servers with the process's one TLS context."""
    return httpx.AsyncClient(verify=tls_context(), **options)


def response_object(response: httpx.Response) -> dict[str, Any]:
    """A REST answer's JSON object: {} when its body is empty, not JSON, or not an object (an error page)."""
    try:
        answer = response.json() if response.content else {}
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}
