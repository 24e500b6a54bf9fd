"""callbridge: phone calls on full-duplex speech-model sessions."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
