"""``python -m callbridge`` runs the CLI."""

from __future__ import annotations

import sys

from callbridge.cli import main

sys.exit(main())
