"""Every carrier's simulated calls against ``callbridge serve`` in its own process: one Markdown table row each.

For each carrier: ``callbridge loadtest --print-env`` gives the settings the bridge needs for the simulated
account, ``callbridge serve`` starts with them and the loopback agent, ``callbridge loadtest --url`` places the
calls (from the same env, so it finds the account's secret, keys and ports), and the server is killed.

    python bench/loadtest_carriers.py --calls 50 --duration 20 --ramp 5 [--providers twilio,telnyx] [--out DIR]
    python bench/loadtest_carriers.py --providers twilio --calls 1,50,100,150,200 --pin   # the capacity sweep

``--calls`` takes a list: one row per carrier and count, each against a fresh server. ``--pin`` runs the
server on the first CPU and the load generator on the others (Linux), so "calls per core" means one core.
The server's CPU budget (``server.cpu_budget_percent``) is off unless ``--cpu-budget`` sets it: the sweep
looks for the knee, not for where admission would stop it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from callbridge.sim.ports import free_port
from callbridge.sim.redis_server import registry_env, start_redis
from callbridge.sim.runner import wait_http_up

PROVIDERS = ("twilio", "signalwire", "telnyx", "plivo", "exotel", "vonage", "audiosocket", "sip")
CALLBRIDGE = str(Path(sys.executable).parent / "callbridge")


def _env_for(provider: str, secret: str, rest_port: int, port: int) -> dict[str, str]:
    printed = subprocess.run(
        [CALLBRIDGE, "loadtest", "--provider", provider, "--secret", secret, "--rest-port", str(rest_port), "--print-env"],
        check=True, capture_output=True, text=True, env=_clean_env(),
    ).stdout  # fmt: skip
    env = _clean_env()
    for line in printed.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = shlex.split(value)[0]
    env.update(
        CALLBRIDGE_LOCAL_ENGINE__AGENT="loopback",
        CALLBRIDGE_SERVER__PUBLIC_URL=f"http://127.0.0.1:{port}",
        CALLBRIDGE_SERVER__MAX_CALLS="1000",
    )
    return env


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CALLBRIDGE_")}


def run_one(provider: str, calls: int, args: argparse.Namespace) -> dict[str, object]:
    port, rest_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = _env_for(provider, secrets.token_hex(16), rest_port, port)
    env["CALLBRIDGE_SERVER__CPU_BUDGET_PERCENT"] = str(args.cpu_budget)
    name = f"{provider}{'-compiled' if args.compiled else ''}{f'-workers{args.workers}' if args.workers > 1 else ''}-{calls}.json"
    try:
        return measure_serve(port, ["--url", url, "--provider", provider, "--rest-port", str(rest_port)], env, args.out / name, calls, args)
    finally:
        key = env.get("CALLBRIDGE_VONAGE__PRIVATE_KEY_PATH")
        if key:  # the key pair --print-env made for this run
            shutil.rmtree(Path(key).parent, ignore_errors=True)


def serve_command(port: int, args: argparse.Namespace) -> list[str]:
    """``callbridge serve`` on ``port``; from ``--compiled``'s tree where given (the server's path alone); ``--workers``."""
    compiled = ["env", f"PYTHONPATH={args.compiled}"] if args.compiled else []
    return [*compiled, CALLBRIDGE, "serve", "--port", str(port), "--workers", str(args.workers), "--log-level", "warning"]


def measure_serve(port: int, target: list[str], env: dict[str, str], out: Path, calls: int, args: argparse.Namespace) -> dict[str, object]:
    """``measure`` against ``callbridge serve`` on ``port`` (``serve_command``): with ``--workers N``, the first N
    CPUs (and with ``--registry redis``, a Redis registry of its own)."""
    with shared_registry(args.workers if args.registry == "redis" else 1) as registry:
        return measure(
            serve_command(port, args), f"http://127.0.0.1:{port}/healthz", target, {**env, **registry}, out, calls, args,
            server_cpus=args.workers,
        )  # fmt: skip


@contextlib.contextmanager
def shared_registry(workers: int) -> Iterator[dict[str, str]]:
    """The env of a Redis registry for ``workers`` processes: a ``redis-server`` of the run's own on a free port,
    stopped after it (nothing for one, whose registry is in memory)."""
    if workers <= 1:
        yield {}
        return
    port = free_port()
    redis = start_redis(port)
    try:
        yield registry_env(f"redis://127.0.0.1:{port}/0")
    finally:
        redis.kill()
        redis.wait(10)


def measure(
    server_command: list[str], up_url: str, target: list[str], env: dict[str, str], out: Path, calls: int, args: argparse.Namespace,
    server_cpus: int = 1,
) -> dict[str, object]:
    """Start a server (``--pin``: on the first ``server_cpus`` CPUs, its processes all), wait until ``up_url`` answers,
    place ``calls`` with ``callbridge loadtest`` and ``target``'s flags (``--pin``: on the other CPUs, or all of them
    where the server has every one), kill the server; the load test's JSON report."""
    cpus = sorted(os.sched_getaffinity(0)) if args.pin else []
    ours, theirs = set(cpus[:server_cpus]), set(cpus[server_cpus:]) or set(cpus)
    server = subprocess.Popen(server_command, env=env)
    if cpus:
        os.sched_setaffinity(server.pid, ours)
    try:
        wait_http_up(up_url)
        if cpus:  # the workers too, whether they started before the supervisor's pinning or after
            for process in psutil.Process(server.pid).children(recursive=True):
                process.cpu_affinity(sorted(ours))
        time.sleep(1.0)  # let the server settle before measuring its CPU
        command = [
            CALLBRIDGE, "loadtest", *target, "--calls", str(calls), "--ramp", str(args.ramp), "--duration", str(args.duration),
            "--server-pid", str(server.pid), "--json", str(out), "--phases", str(args.phases),
        ]  # fmt: skip
        print("$", " ".join(command), flush=True)
        generator = subprocess.Popen(command, env=env)
        if cpus:
            os.sched_setaffinity(generator.pid, theirs)
        try:
            generator.wait(timeout=args.ramp + args.duration + 120)
        finally:
            generator.kill()
        loop_lag = server_loop_lag(up_url)
    finally:
        workers = psutil.Process(server.pid).children(recursive=True) if server.poll() is None else []
        server.kill()  # uvicorn may sit out a plain SIGTERM while connections close
        server.wait(10)
        for worker in workers:  # ``--workers``: in their own process group; not left draining into the next level
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()
        psutil.wait_procs(workers, timeout=10)
    report: dict[str, object] = json.loads(out.read_text())
    if loop_lag:
        report["server_loop_lag_buckets"] = loop_lag
    return report


def server_loop_lag(up_url: str) -> dict[str, int]:
    """callbridge's ``callbridge_event_loop_lag_seconds`` histogram (a timer's lateness, sampled twice a second) as
    ``{"le": count at or below}``, from the server's ``/metrics`` at the run's end; empty where there is none."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(up_url.rsplit("/", 1)[0] + "/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {
        sample.labels["le"]: int(sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == "callbridge_event_loop_lag_seconds"
        for sample in family.samples
        if sample.name.endswith("_bucket")
    }


def row(report: dict[str, object]) -> str:
    def q(key: str, *names: str) -> str:
        stats = report[key]
        assert isinstance(stats, dict)
        return " / ".join(f"{stats[n]:.1f}" if n in stats else "n/a" for n in names)

    return (
        f"| {report['provider']} | {report['calls']} | {q('round_trip_ms', 'p50', 'p95', 'p99', 'max')} | {q('heard_round_trip_ms', 'p50', 'p99')} "
        f"| {q('first_audio_ms', 'p50')} | {report['clicks_returned']}/{report['clicks_sent']} | {report['failed_calls']} "
        f"| {report['server_cpu_ms_per_call_second']:.2f} | {report['server_rss_mb']:.1f} MB "
        f"| {report['generator_cpu_ms_per_call_second']:.2f} / {q('generator_tick_lag_ms', 'p99')} |"
    )


def add_run_arguments(parser: argparse.ArgumentParser, calls: str) -> None:
    """The flags every load run takes: ``--calls`` (a list: a row per level), ``--duration``, ``--ramp``, ``--out``."""
    parser.add_argument("--calls", default=calls, help="calls at once; a list (1,50,100) gives a row per count")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--ramp", type=float, default=5.0)
    parser.add_argument("--out", type=Path, help="where the JSON reports go (default: a temporary directory)")
    parser.add_argument("--compiled", type=Path, metavar="DIR", help="run callbridge serve from this compiled tree (bench/compiled_tree.py)")
    parser.add_argument(
        "--workers", type=int, default=1,
        help="callbridge serve --workers N: N processes on the port, pinned to the first N CPUs",
    )  # fmt: skip
    parser.add_argument(
        "--phases", type=int, default=1,
        help="callbridge loadtest --phases N: the calls' 20 ms clocks over N instants (1: all in step, one burst)",
    )
    parser.add_argument(
        "--registry", choices=("memory", "redis"), default="memory",
        help="with --workers: the supervisor's registry (shipped default) or a redis-server of the run's own",
    )  # fmt: skip


def pinned_run(parser: argparse.ArgumentParser, prefix: str) -> argparse.Namespace:
    """The parsed flags of a run whose server is pinned to the first CPU and its generator to the others, where
    there are two or more (``pin``), its reports in ``out`` (a temporary directory named ``prefix``… by default)."""
    args = parser.parse_args()
    args.pin = len(os.sched_getaffinity(0)) >= 2
    reports_directory(args, prefix)
    return args


def print_table(args: argparse.Namespace, columns: list[str], rows: list[str]) -> None:
    """A Markdown table of ``pinned_run``'s rows, under the machine, the run's shape and where its reports are."""
    print(
        f"\nMachine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"{args.duration:g} s calls, {args.ramp:g} s ramp; server pinned: {args.pin}; reports in {args.out}\n"
    )
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    print("\n".join(rows))


def reports_directory(args: argparse.Namespace, prefix: str) -> None:
    """``args.out``, made (a temporary directory where none was given)."""
    args.out = args.out or Path(tempfile.mkdtemp(prefix=prefix))
    args.out.mkdir(parents=True, exist_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, calls="50")
    parser.add_argument("--pin", action="store_true", help="server on the first CPU, the generator on the others")
    parser.add_argument("--cpu-budget", type=float, default=0.0, help="the server's server.cpu_budget_percent (0: off)")
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    args = parser.parse_args()
    reports_directory(args, "callbridge-loadtest-")
    counts = [int(n) for n in args.calls.split(",")]
    rows = [row(run_one(provider, calls, args)) for provider in args.providers.split(",") for calls in counts]
    print(
        "\n| carrier | calls | click round trip p50 / p95 / p99 / max (ms) | heard p50 / p99 (ms) | first audio p50 (ms) | clicks back | failed calls "
        "| server CPU-ms per call-second | server RSS | generator CPU-ms per call-second / tick lag p99 (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
