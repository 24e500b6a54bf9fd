"""Each fault-simulator seed's outcome, one line a seed: how the call ended, its streams, and what the engine was told
the caller heard of each reply. Two trees that print the same lines ran the same calls the same way: the check that a
refactor of the cores changed no behaviour (issue #39).

    python bench/fault_digest.py --seeds 3000 > after.txt          # --calls: seeds of several calls
    (cd ../before && PYTHONPATH=. python bench/fault_digest.py --seeds 3000) > before.txt && cmp before.txt after.txt
"""

from __future__ import annotations

import argparse
import sys

from callbridge.sim.faults import run_calls_seed, run_seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1000, help="seeds 0..N-1 (default 1000)")
    parser.add_argument("--calls", action="store_true", help="seeds of several calls on one engine server")
    args = parser.parse_args(argv)
    for seed in range(args.seeds):
        if args.calls:
            for call in run_calls_seed(seed).calls:
                print(seed, call.call_id, call.outcome, call.streams, sorted(call.heard_told.items()))
            continue
        result = run_seed(seed)
        print(seed, result.outcome, result.streams, sorted(result.heard_told.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
