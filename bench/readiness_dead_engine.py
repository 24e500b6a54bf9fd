"""How long ``/readyz`` takes to say ``no_engine`` when the only engine nobody listens for (#40: 16.4 s after the
process listened, against a goal of 15 s).

Starts ``callbridge serve`` (the shipped settings, but ``engine.kind = "realtime"`` with one engine URL on a closed
port), polls ``/readyz`` every 50 ms from the moment it first answers (the process listens) until it answers 503,
and prints that time. ``--tree``: the checkout to run (another clone, for a before/after on one machine).

Run: ``python bench/readiness_dead_engine.py [--tree PATH] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.sim.ports import free_port  # noqa: E402


def _once(tree: Path) -> float:
    port, dead = free_port(), free_port()
    command = [
        sys.executable, "-m", "callbridge", "--set", "engine.kind=realtime", "--set", f'engine.urls=["ws://127.0.0.1:{dead}"]',
        "--set", f"server.port={port}", "--set", "server.host=127.0.0.1", "serve",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(tree))
    process = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        listening: float | None = None
        while listening is None or time.monotonic() - listening < 60:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code
            except httpx.HTTPError:
                status = None
            if status is not None and listening is None:
                listening = time.monotonic()
            if status == 503 and listening is not None:
                return time.monotonic() - listening
            time.sleep(0.05)
        raise SystemExit("no 503 within 60 s")
    finally:
        process.terminate()
        process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    times = [_once(args.tree.resolve()) for _ in range(args.runs)]
    print(f"{args.tree}: /readyz 503 no_engine after " + ", ".join(f"{t:.2f}" for t in times) + " s (from the first answer)")


if __name__ == "__main__":
    main()
