"""Issue #19's measure: pipecat's Twilio loopback (``../shared/peers/pipecat_loopback.py``) and ``callbridge serve``
with its loopback agent, back to back at each load, by the same generator, on the same machine — one table with
the ratios.

    python bench/side_by_side.py --calls 1,30 [--duration 20] [--ramp 5] [--pipecat-python ../pipecat-venv/bin/python]

Each level: a fresh pipecat server, ``callbridge loadtest --ws-url`` onto it (Twilio Media Streams straight on:
``connected``, ``start``, ``media`` every 20 ms, clicks timed back); then a fresh ``callbridge serve`` and
``callbridge loadtest --url`` (the simulated Twilio's signed webhook and stream, ``bench/loadtest_carriers.py``;
the server's shipped defaults but for its loopback agent and ``max_calls`` 1000, neither limit reached here).
With two or more CPUs each server runs on the first and the generator on the others (Linux affinity). CPU is the
server process's own, per call-second; round trip is a click's, sent by the caller → back at the carrier.
Install pipecat's venv first (``../shared/peers/README.md``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import loadtest_carriers  # noqa: E402

from callbridge.config import ServerSettings  # noqa: E402
from callbridge.sim.ports import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def run_pipecat(calls: int, args: argparse.Namespace) -> dict[str, object]:
    """One level against a fresh pipecat loopback; the load test's JSON report."""
    port = free_port()
    return loadtest_carriers.measure(
        [args.pipecat_python, str(args.peer), "--port", str(port)], f"http://127.0.0.1:{port}/",
        ["--ws-url", f"ws://127.0.0.1:{port}/ws"], loadtest_carriers._clean_env(), args.out / f"pipecat-{calls}.json", calls, args,
    )  # fmt: skip


def _stats(report: dict[str, object], key: str) -> dict[str, float]:
    stats = report[key]
    assert isinstance(stats, dict)
    return stats


def _failed(report: dict[str, object]) -> str:
    """Calls that failed, and of them those refused busy at the answer (admission: past what the core carries)."""
    refused = report.get("refused_calls", 0)
    return f"{report['failed_calls']} ({refused} busy)" if refused else str(report["failed_calls"])


def row(calls: int, peer: dict[str, object], ours: dict[str, object]) -> str:
    peer_rt, ours_rt = _stats(peer, "round_trip_ms"), _stats(ours, "round_trip_ms")
    peer_cpu, ours_cpu = peer["server_cpu_ms_per_call_second"], ours["server_cpu_ms_per_call_second"]
    assert isinstance(peer_cpu, float) and isinstance(ours_cpu, float)
    return (
        f"| {calls} | {peer_rt['p50']:.1f} / {peer_rt['p99']:.1f} | {peer_cpu:.2f} | {peer['failed_calls']} "
        f"| {ours_rt['p50']:.1f} / {ours_rt['p99']:.1f} | {ours_cpu:.2f} | {_failed(ours)} "
        f"| **{ours_cpu / peer_cpu:.2f}×** | **{ours_rt['p50'] / peer_rt['p50']:.3f}×** |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    loadtest_carriers.add_run_arguments(parser, calls="1,30")
    parser.add_argument("--pipecat-python", default=str(ROOT.parent / "pipecat-venv" / "bin" / "python"))
    parser.add_argument("--peer", type=Path, default=ROOT.parent / "shared" / "peers" / "pipecat_loopback.py")
    args = loadtest_carriers.pinned_run(parser, "callbridge-side-by-side-")
    args.cpu_budget = ServerSettings().cpu_budget_percent  # callbridge as shipped (past the knee it refuses calls busy)
    rows = []
    for calls in (int(level) for level in args.calls.split(",")):
        peer = run_pipecat(calls, args)
        ours = loadtest_carriers.run_one("twilio", calls, args)
        rows.append(row(calls, peer, ours))
    columns = ["calls", "pipecat p50 / p99 ms", "pipecat CPU-ms per call-s", "failed", "callbridge p50 / p99 ms",
               "callbridge CPU-ms per call-s", "failed", "CPU ratio", "p50 ratio"]  # fmt: skip
    loadtest_carriers.print_table(args, columns, rows)


if __name__ == "__main__":
    main()
