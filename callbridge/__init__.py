"""callbridge: phone calls on full-duplex speech-model sessions."""

from __future__ import annotations

import os

# Before numpy loads: one OpenBLAS thread. The bridge's matrix products are small (a resampler's 20 ms of taps);
# with a second BLAS thread, OpenBLAS's helper busy-waits between them: a soak measured it at 0.6 of a core next to
# 0.8 for the whole event loop, all of it counted against ``server.cpu_budget_percent``. Set it to override.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"

__all__ = ["__version__"]
