"""A copy of this checkout (its files that git tracks or would) with its per-frame modules compiled by mypyc
(``callbridge/compiled.py``), built in place: what ``--compiled DIR`` of the load benchmarks runs ``callbridge
serve`` from (``PYTHONPATH=DIR``), and where CI runs tests on the compiled build.

    python bench/compiled_tree.py DIR

Needs the project's dependencies, mypy and setuptools ≥ 77 in this interpreter's environment (``setup.py``), and a
C compiler. The checkout itself is not touched (a compiled module in the source tree would shadow later edits).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(target: Path) -> None:
    """Copy the checkout to ``target`` (replacing a previous copy) and compile it there."""
    if target.resolve() == ROOT:
        raise SystemExit("the compiled tree must not be the checkout itself")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True
    ).stdout.decode()
    shutil.rmtree(target, ignore_errors=True)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "setup.py", "--quiet", "build_ext", "--inplace"], cwd=target, check=True,
        env={**os.environ, "CALLBRIDGE_COMPILE": "1"},
    )  # fmt: skip
    print(f"compiled in {time.monotonic() - started:.0f} s: {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path)
    build(parser.parse_args().target)


if __name__ == "__main__":
    main()
