"""Every carrier's simulated calls against ``callbridge serve`` in its own process: one Markdown table row each.

For each carrier: ``callbridge loadtest --print-env`` gives the settings the bridge needs for the simulated
account, ``callbridge serve`` starts with them and the loopback agent, ``callbridge loadtest --url`` places the
calls (from the same env, so it finds the account's secret, keys and ports), and the server is killed.

    python bench/loadtest_carriers.py --calls 50 --duration 20 --ramp 5 [--providers twilio,telnyx] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

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


def _wait_up(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_one(provider: str, args: argparse.Namespace) -> dict[str, object]:
    port, rest_port = 8099, 8098
    url = f"http://127.0.0.1:{port}"
    env = _env_for(provider, secrets.token_hex(16), rest_port, port)
    out = args.out / f"{provider}.json"
    server = subprocess.Popen([CALLBRIDGE, "serve", "--port", str(port), "--log-level", "warning"], env=env)
    try:
        _wait_up(url)
        time.sleep(1.0)  # let the server settle before measuring its CPU
        command = [
            CALLBRIDGE, "loadtest", "--url", url, "--provider", provider, "--rest-port", str(rest_port),
            "--calls", str(args.calls), "--ramp", str(args.ramp), "--duration", str(args.duration),
            "--server-pid", str(server.pid), "--json", str(out),
        ]  # fmt: skip
        print("$", " ".join(command), flush=True)
        subprocess.run(command, env=env, timeout=args.ramp + args.duration + 120, check=False)
    finally:
        server.kill()  # uvicorn may sit out a plain SIGTERM while connections close
        server.wait(10)
        key = env.get("CALLBRIDGE_VONAGE__PRIVATE_KEY_PATH")
        if key:  # the key pair --print-env made for this run
            shutil.rmtree(Path(key).parent, ignore_errors=True)
    report: dict[str, object] = json.loads(out.read_text())
    return report


def row(report: dict[str, object]) -> str:
    def q(key: str, *names: str) -> str:
        stats = report[key]
        assert isinstance(stats, dict)
        return " / ".join(f"{stats[n]:.1f}" if n in stats else "n/a" for n in names)

    return (
        f"| {report['provider']} | {q('round_trip_ms', 'p50', 'p99')} | {q('heard_round_trip_ms', 'p50', 'p99')} "
        f"| {q('first_audio_ms', 'p50')} | {report['clicks_returned']}/{report['clicks_sent']} | {report['failed_calls']} "
        f"| {report['server_cpu_ms_per_call_second']:.2f} | {report['server_rss_mb']:.1f} MB "
        f"| {report['generator_cpu_ms_per_call_second']:.2f} / {q('generator_tick_lag_ms', 'p99')} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--ramp", type=float, default=5.0)
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    parser.add_argument("--out", type=Path, help="where the JSON reports go (default: a temporary directory)")
    args = parser.parse_args()
    args.out = args.out or Path(tempfile.mkdtemp(prefix="callbridge-loadtest-"))
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [row(run_one(provider, args)) for provider in args.providers.split(",")]
    print(
        "\n| carrier | click round trip p50 / p99 (ms) | heard p50 / p99 (ms) | first audio p50 (ms) | clicks back | failed calls "
        "| server CPU-ms per call-second | server RSS | generator CPU-ms per call-second / tick lag p99 (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
