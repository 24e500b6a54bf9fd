"""A calling campaign: every number of a CSV placed through a running bridge (``POST /calls``), its metadata the row.

    python -m examples.campaign numbers.csv --bridge https://bridge.example.com --carrier twilio --from +15559870000

``numbers.csv`` has a ``to`` column (E.164) and any others (``name``, ``crm_id``…), which go with the call as its
metadata and come back in every event of it. The bridge paces the dials (``outbound.calls_per_second``, its queue);
this asks no faster than ``--per-second`` and, where the bridge's queue is full (429 ``queue_full``), waits and asks
again — retries, and what to do with a number that was busy or did not answer (``call.failed`` at your application),
are the campaign's, not the bridge's. The token is ``$CALLBRIDGE_OUTBOUND__API_TOKEN``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import sys
from collections.abc import Iterable
from pathlib import Path

import httpx

QUEUE_FULL_WAIT_S = 2.0


async def place_all(
    rows: Iterable[dict[str, str]], *, bridge: str, token: str, carrier: str, from_: str, per_second: float, machine_detection: str = "off"
) -> list[tuple[str, str]]:
    """Each row placed: (its number, the dial id, or why not)."""
    placed: list[tuple[str, str]] = []
    async with httpx.AsyncClient(timeout=10.0) as http:
        for row in rows:
            to = row["to"].strip()
            metadata = {key: value for key, value in row.items() if key != "to" and value}
            body = {"carrier": carrier, "to": to, "from": from_, "metadata": metadata, "machine_detection": machine_detection}
            while True:
                response = await http.post(f"{bridge.rstrip('/')}/calls", json=body, headers={"Authorization": f"Bearer {token}"})
                if response.status_code != 429:
                    break
                await asyncio.sleep(QUEUE_FULL_WAIT_S)  # the bridge's queue is full: ask again once it has room
            answer = response.json()
            placed.append((to, answer["dial_id"] if response.status_code == 202 else f"refused: {answer.get('error')} {answer.get('detail', '')}"))
            await asyncio.sleep(1 / per_second)
    return placed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--bridge", required=True, help="the bridge's base URL")
    parser.add_argument("--carrier", required=True)
    parser.add_argument("--from", dest="from_", required=True, help="the number to call from, E.164")
    parser.add_argument("--per-second", type=float, default=1.0, help="requests a second at most (the bridge paces the dials)")
    parser.add_argument("--machine-detection", default="off", choices=("off", "hang_up"))
    args = parser.parse_args(argv)
    token = os.environ.get("CALLBRIDGE_OUTBOUND__API_TOKEN")
    if not token:
        print("set CALLBRIDGE_OUTBOUND__API_TOKEN to the bridge's outbound.api_token", file=sys.stderr)
        return 2
    with args.csv.open(newline="") as file:
        rows = list(csv.DictReader(file))
    placed = asyncio.run(place_all(rows, bridge=args.bridge, token=token, carrier=args.carrier, from_=args.from_,
                                   per_second=args.per_second, machine_detection=args.machine_detection))  # fmt: skip
    for to, outcome in placed:
        print(f"{to}\t{outcome}")
    return 0 if all(not outcome.startswith("refused") for _, outcome in placed) else 1


if __name__ == "__main__":
    sys.exit(main())
