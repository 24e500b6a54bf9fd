"""Each fault-simulator seed's outcome, one line a seed: how the call ended, its streams, and what the engine was told
the caller heard of each reply. Two trees that print the same lines ran the same calls the same way: the check that a
refactor of the cores changed no behaviour (issue #39).

    python bench/fault_digest.py --seeds 3000 > after.txt
    (cd ../before && PYTHONPATH=. python bench/fault_digest.py --seeds 3000) > before.txt && cmp before.txt after.txt
"""

from __future__ import annotations

import argparse
import sys

from callbridge.sim.faults import run_seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1000, help="seeds 0..N-1 (default 1000)")
    args = parser.parse_args(argv)
    for seed in range(args.seeds):
        result = run_seed(seed)
        print(seed, result.outcome, result.streams, sorted(result.heard_told.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
