"""The ``callbridge`` command.

Options shared by every subcommand (``--config``, ``--set``, ``--log-level``,
``--log-format``) may stand before or after the subcommand's name. Flags are
passed to the configuration as strings, so a bad value gets the same message,
naming the key, as a bad env var or TOML value. Exit codes: 0 done, 1 failed
at run time, 2 invalid usage or configuration (or an extra it needs is not
installed), 3 a listener's address cannot be had (in use, not this machine's).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn
from urllib.parse import urlsplit

from callbridge import __version__
from callbridge.carriers import DEFAULT_SIMULATED, carrier_spec, direct_names, simulated_names
from callbridge.cli_args import (
    EXIT_USAGE,
    app_loads,
    at_least_one,
    at_or_after_start,
    caller_audio,
    can_write,
    outbound_runs,
    print_config_error,
    reconnects,
    seconds_above_zero,
)
from callbridge.cli_call import add_call
from callbridge.cli_simulate import add_simulate
from callbridge.cli_stream_token import add_stream_token
from callbridge.config import (
    ConfigError,
    Settings,
    load_settings,
    merge_overrides,
    parse_assignment,
)
from callbridge.serving import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from callbridge.sim.load_samples import LoadSamples

__all__ = ["main", "run"]

# 0 and 1: ``callbridge.serving``'s EXIT_OK, EXIT_FAILED
EXIT_UNAVAILABLE: Final = 3


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (the console script exits with it)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        settings = load_settings(getattr(args, "config", None), _overrides(args))
    except ConfigError as exc:
        print_config_error(exc, sys.stderr)
        return EXIT_USAGE
    handler: Callable[[Settings, argparse.Namespace], int] = args.handler
    return handler(settings, args)


def run() -> None:
    """The console script's entry point."""
    sys.exit(main())


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (the usage is ``--help``'s), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--config", metavar="PATH", default=argparse.SUPPRESS, help="TOML configuration file (default: $CALLBRIDGE_CONFIG)"
    )
    common.add_argument(
        "--set",
        metavar="SECTION.KEY=VALUE",
        action="append",
        dest="assignments",
        default=argparse.SUPPRESS,
        help="override one configuration key; repeatable",
    )
    common.add_argument("--log-level", default=argparse.SUPPRESS, help="debug, info, warning or error")
    common.add_argument("--log-format", default=argparse.SUPPRESS, help="auto, json or console")

    parser = _Parser(
        prog="callbridge",
        description="Put phone calls on full-duplex speech-model sessions.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"callbridge {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = commands.add_parser("serve", parents=[common], help="serve carrier webhooks and media streams")
    serve.add_argument("--host", default=argparse.SUPPRESS, help="listen address (server.host)")
    serve.add_argument("--port", default=argparse.SUPPRESS, help="listen port (server.port)")
    serve.add_argument("--workers", default=argparse.SUPPRESS, help="bridge processes on the one port (server.workers)")
    serve.set_defaults(handler=_serve)

    engine_server = commands.add_parser(
        "engine-server", parents=[common], help="serve the embedded engine over vllm-omni's duplex protocol"
    )
    engine_server.add_argument("--host", default=argparse.SUPPRESS, help="listen address (engine_server.host)")
    engine_server.add_argument("--port", default=argparse.SUPPRESS, help="listen port (engine_server.port)")
    engine_server.add_argument("--agent", default=argparse.SUPPRESS, help="echo, loopback or tone (local_engine.agent)")
    engine_server.set_defaults(handler=_engine_server)
    add_simulate(commands, common)
    _add_loadtest(commands, common)
    add_stream_token(commands, common)
    add_call(commands, common)

    app_schema = commands.add_parser(
        "app-schema", parents=[common], help="print the JSON Schema of the application's webhook (assistant-request)"
    )
    app_schema.set_defaults(handler=_app_schema)

    config = commands.add_parser("config", parents=[common], help="inspect the configuration")
    config_commands = config.add_subparsers(dest="config_command", metavar="COMMAND", required=True)
    check = config_commands.add_parser(
        "check", parents=[common], help="validate and print the effective configuration, secrets masked"
    )
    check.add_argument("--format", choices=["toml", "json"], default="toml", dest="output_format")
    check.set_defaults(handler=_config_check)
    return parser


def _add_loadtest(commands: Any, common: argparse.ArgumentParser) -> None:
    """``callbridge loadtest``: N simulated calls at real time."""
    loadtest = commands.add_parser(
        "loadtest",
        parents=[common],
        help="N simulated calls at real time: round-trip latency, loss, CPU",
        description="Place N simulated calls (any carrier: its real answer flow, signatures and wire) at real time "
        "against a bridge whose engine is the loopback agent (callbridge serve --set local_engine.agent=loopback), "
        "or the echo agent with --barge-in-every, and report what the bridge added. Against a separate bridge, "
        "--print-env gives the settings it needs for the simulated carrier.",
    )
    loadtest.add_argument("--provider", choices=simulated_names(), default=DEFAULT_SIMULATED, help=f"the carrier to simulate (default: {DEFAULT_SIMULATED})")
    loadtest.add_argument("--url", help="the bridge's public base URL (default: a bridge started in this process)")
    loadtest.add_argument(
        "--ws-url",
        help="instead of a bridge, any server that speaks the carrier's media websocket at this URL (a voice bot: "
        f"the stream's opening messages, then media; no answer webhook, no signatures; carriers: {', '.join(direct_names())})",
    )
    loadtest.add_argument(
        "--secret",
        "--auth-token",
        dest="secret",
        help="the simulated account's secret, which the bridge's settings must match (see --print-env; default: "
        "the provider's secret from the configuration, the key its spec names)",
    )
    loadtest.add_argument(
        "--rest-port", type=int, default=8098, help="port of the simulated carrier's REST API (hang-ups, call control) (default: 8098)"
    )
    loadtest.add_argument(
        "--print-env", action="store_true", help="print the env a separate `callbridge serve` needs for --provider and --secret, then exit"
    )
    loadtest.add_argument("--calls", type=at_least_one, default=10, help="how many calls (default: 10)")
    loadtest.add_argument("--ramp", metavar="S", type=at_or_after_start, default=5.0, help="seconds over which calls start")
    loadtest.add_argument("--duration", metavar="S", type=seconds_above_zero, default=20.0, help="seconds each call lasts")
    loadtest.add_argument("--audio", metavar="WAV", type=Path, help="what the caller says (16-bit PCM WAV; default: a bundled sample)")
    loadtest.add_argument("--click-every", metavar="S", type=seconds_above_zero, default=1.0, help="a click to time every S seconds (default: 1)")
    loadtest.add_argument(
        "--phases", metavar="N", type=int, choices=range(1, 21), default=1,
        help="the calls' 20 ms clocks spread over N instants 20/N ms apart, as independent calls' are "
        "(default: 1, every call's frame at the same instant: one burst)",
    )  # fmt: skip
    loadtest.add_argument(
        "--barge-in-every", metavar="S", type=seconds_above_zero, help="talk over the agent at most every S seconds (the echo agent; no clicks)"
    )
    loadtest.add_argument("--dtmf-every", metavar="S", type=seconds_above_zero, help="each call presses a key every S seconds")
    loadtest.add_argument("--drop-every", metavar="S", type=seconds_above_zero, help="drop each call's media connection every S seconds")
    loadtest.add_argument(
        "--outbound", action="store_true",
        help="the bridge places the calls (POST /calls at the ramp's times, dialled at outbound.calls_per_second); a bridge in this process",
    )  # fmt: skip
    loadtest.add_argument("--server-pid", type=int, help="measure this process's CPU and RSS (the bridge's), its child processes' too (--workers)")
    loadtest.add_argument(
        "--metrics-url", help="the bridge's base URL for /metrics (default: --url when it is http(s); 'none': not scraped)"
    )
    loadtest.add_argument("--json", metavar="PATH", type=Path, help="write the report as JSON")
    loadtest.add_argument(
        "--processes",
        metavar="N|auto",
        type=_processes,
        default=1,
        help="generator processes sharing the calls (default 1; auto: one per 120 calls, at most one per CPU; needs --url)",
    )
    loadtest.add_argument(
        "--png", metavar="PATH", type=Path, help="draw the latency over time and its histogram (needs pip install 'callbridge[plot]')"
    )
    loadtest.set_defaults(handler=_loadtest)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    layers: list[dict[str, Any]] = [parse_assignment(text) for text in getattr(args, "assignments", [])]
    listener = "engine_server" if getattr(args, "command", None) == "engine-server" else "server"
    flags = {
        ("log", "level"): getattr(args, "log_level", None),
        ("log", "format"): getattr(args, "log_format", None),
        (listener, "host"): getattr(args, "host", None),
        (listener, "port"): getattr(args, "port", None),
        ("server", "workers"): getattr(args, "workers", None),
        ("local_engine", "agent"): getattr(args, "agent", None),
        ("app", "module"): getattr(args, "app", None),
    }
    layers += [{section: {key: value}} for (section, key), value in flags.items() if value is not None]
    return merge_overrides(*layers)


def _app_schema(settings: Settings, args: argparse.Namespace) -> int:
    from callbridge.application.schema import application_schema

    print(json.dumps(application_schema(), indent=2))
    return 0


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    if not app_loads(settings):
        return EXIT_USAGE
    return _with_listeners(settings, args, "server", _serve_on)


def _serve_on(settings: Settings, sock: Any) -> int:
    if settings.server.workers > 1:
        from callbridge.workers import serve_workers

        return serve_workers(settings, sock)
    from callbridge.serving import serve_bridge

    return serve_bridge(settings, [sock])


def _with_listeners(settings: Settings, args: argparse.Namespace, section: str, serve: Callable[[Settings, Any], int]) -> int:
    """``serve`` on the HTTP socket of ``section`` (``server``, ``engine_server``), once nothing the settings need
    is missing and every listener they enable can have its address; else one line for each problem, and the exit
    code."""
    from callbridge.preflight import ListenerUnavailable, bind_http, file_problems, listener_problems, missing_extras

    command = f"callbridge {args.command}"
    missing = missing_extras(settings) + (file_problems(settings) if section == "server" else [])
    for sentence in missing:
        print(f"{command}: {sentence}", file=sys.stderr)
    if missing:
        return EXIT_USAGE
    listen = getattr(settings, section)
    try:
        sock = bind_http(f"{section}.port", listen.host, listen.port)
    except ListenerUnavailable as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    problems = listener_problems(settings) if section == "server" else []
    for problem in problems:
        print(f"{command}: {problem}", file=sys.stderr)
    if problems:
        sock.close()
        return EXIT_UNAVAILABLE
    try:
        return serve(settings, sock)
    finally:
        sock.close()


def _engine_server(settings: Settings, args: argparse.Namespace) -> int:
    return _with_listeners(settings, args, "engine_server", _serve_engine)


def _serve_engine(settings: Settings, sock: Any) -> int:
    from callbridge.engine.server import create_engine_app
    from callbridge.serving import run_uvicorn

    return run_uvicorn(
        settings, create_engine_app(settings), settings.engine_server.host, settings.engine_server.port, sockets=[sock], bridge=False
    )


def _metrics_url(given: str | None, url: str | None) -> str | None:
    if given is not None:
        return None if given == "none" else given
    return url if url is not None and urlsplit(url).scheme in ("http", "https") else None


def _bridge_url_problem(url: str) -> tuple[str, int] | None:
    """Why ``loadtest --url`` cannot be a bridge, and the exit code: not an http(s) base URL (usage), or nothing
    accepts a connection there (failed; found in a second, not as every call failing)."""
    import socket

    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return f"not a URL ({exc})", EXIT_USAGE
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "give the bridge's base URL, http://host:port or https://host", EXIT_USAGE
    try:
        socket.create_connection((parts.hostname, port), timeout=3).close()
    except OSError as exc:
        return f"nothing answers at {parts.scheme}://{parts.netloc} ({exc.strerror or exc}): start the bridge, or fix --url", EXIT_FAILED
    return None


def _processes(text: str) -> int | None:
    """``--processes``: a count, or None for ``auto``."""
    if text == "auto":
        return None
    try:
        return at_least_one(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive number or auto, got {text!r}") from None


def _loadtest(settings: Settings, args: argparse.Namespace) -> int:

    from callbridge.logging import configure_logging
    from callbridge.sim.loadtest import (
        LoadTestOptions,
        bridge_env,
        load_test_samples,
        report_json,
        secret_from_settings,
    )
    from callbridge.sim.loadtest_plot import (
        PlotUnavailable,
        require_matplotlib,
        write_png,
    )
    from callbridge.sim.loadtest_pool import processes_for, run_pooled
    from callbridge.sim.runner import sample_caller_wav

    if getattr(args, "log_level", None) is None:
        settings = settings.model_copy(update={"log": settings.log.model_copy(update={"level": "warning"})})
    configure_logging(settings.log)
    rest_url = f"http://127.0.0.1:{args.rest_port}"
    if args.print_env:
        print(bridge_env(args.provider, args.secret or secret_from_settings(args.provider, settings) or _fresh_secret(), rest_url), end="")
        return EXIT_OK
    if args.png:
        try:
            require_matplotlib()
        except PlotUnavailable as exc:
            print(f"callbridge loadtest: {exc}", file=sys.stderr)
            return EXIT_USAGE
    direct_protocol = carrier_spec(args.provider).direct_protocol
    if _target_flags_wrong(args, direct_protocol):
        return EXIT_USAGE
    processes = processes_for(args.calls, args.processes) if args.url else 1
    if not (can_write(args, "json") and can_write(args, "png")):
        return EXIT_USAGE
    audio = caller_audio(args, args.audio or sample_caller_wav())
    if audio is None:
        return EXIT_USAGE
    if args.drop_every and not reconnects(args.provider):
        print(f"callbridge loadtest: --drop-every: a {args.provider} call cannot come back after its media drops", file=sys.stderr)
        return EXIT_USAGE

    if args.outbound and not outbound_runs(args):
        return EXIT_USAGE
    options = LoadTestOptions(
        calls=args.calls, ramp_s=args.ramp, duration_s=args.duration, click_every_ms=_ms(args.click_every) or 1000, audio=audio,
        barge_in_every_ms=_ms(args.barge_in_every), dtmf_every_ms=_ms(args.dtmf_every), drop_every_ms=_ms(args.drop_every),
        server_pid=args.server_pid, metrics_url=_metrics_url(args.metrics_url, args.url), phases=args.phases,
        outbound_token=_fresh_secret() if args.outbound else None,
    )  # fmt: skip
    secret = args.secret or secret_from_settings(args.provider, settings)
    if args.url and secret is None:
        print(f"callbridge loadtest: --secret is needed to sign {args.provider} requests (see --print-env)", file=sys.stderr)
        return EXIT_USAGE
    if args.url:
        found = _bridge_url_problem(args.url)
        if found is not None:
            problem, code = found
            print(f"callbridge loadtest: --url {args.url}: {problem}", file=sys.stderr)
            return code
    _say_what_runs(args, processes, direct_protocol)
    if processes > 1:
        run = run_pooled(
            settings, args.provider, options, processes=processes, url=args.url, secret=secret or "", rest_port=args.rest_port,
            print_progress=lambda line: print(line, flush=True),
        )  # fmt: skip
    else:
        run = load_test_samples(settings, args.provider, options, url=args.url, secret=secret or "", rest_url=rest_url, ws_url=args.ws_url)
    samples = _run_load(run)
    if isinstance(samples, int):
        return samples
    report = samples.report()
    print(report.render())
    if args.json:
        args.json.write_bytes(report_json(report))
    if args.png:
        write_png(samples, args.png)
    return EXIT_OK if report.failed_calls == 0 else EXIT_FAILED


def _say_what_runs(args: argparse.Namespace, processes: int, direct_protocol: str | None) -> None:
    if args.ws_url:
        print(f"callbridge loadtest: straight onto {args.ws_url} ({direct_protocol}, no webhook)")
    elif not args.url:
        print("callbridge loadtest: no --url: the bridge runs in this process, beside the generator")
    in_processes = f" in {processes} generator processes" if processes > 1 else ""
    print(f"callbridge loadtest: {args.calls} {args.provider} calls over {args.ramp:g} s, {args.duration:g} s each{in_processes}")


def _fresh_secret() -> str:
    import secrets

    return secrets.token_hex(16)


def _ms(seconds: float | None) -> int | None:
    return int(seconds * 1000) if seconds else None


def _target_flags_wrong(args: argparse.Namespace, direct_protocol: str | None) -> bool:
    """``loadtest``'s flags that name what it loads contradict each other (printed)."""
    if args.ws_url is not None:
        wrong = [flag for flag, given in (("--url", args.url), ("--drop-every", args.drop_every), ("--processes", (args.processes or 2) > 1))
                 if given] + ([] if direct_protocol else [f"--provider {args.provider}"])  # fmt: skip
        if not args.ws_url.startswith(("ws://", "wss://")) or wrong:
            problem = f"not with {', '.join(wrong)}" if wrong else "expected a ws:// or wss:// URL"
            print(f"callbridge loadtest: --ws-url {args.ws_url}: {problem} (a carrier with a direct mode: "
                  f"{', '.join(direct_names())}; one process)", file=sys.stderr)  # fmt: skip
            return True
    if args.processes is not None and args.processes > 1 and not args.url:
        print("callbridge loadtest: --processes needs --url (a bridge in its own process, e.g. callbridge serve)", file=sys.stderr)
        return True
    return False


def _run_load(run: Any) -> LoadSamples | int:
    """Run the load test's coroutine (on uvloop where it is installed): its samples, or the exit code of a failure
    (printed)."""
    import asyncio
    import contextlib

    run_loop: Callable[[Any], LoadSamples] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        run_loop = uvloop.run
    try:
        return run_loop(run)
    except ValueError as exc:  # a carrier that cannot be split across processes
        print(f"callbridge loadtest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, RuntimeError) as exc:  # the REST port is taken, the bridge is not there, a generator failed
        print(f"callbridge loadtest: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _config_check(settings: Settings, args: argparse.Namespace) -> int:
    """The effective settings; then, on stderr, what is wrong with the files they name (exit 2 where anything is)."""
    from callbridge.preflight import file_problems

    values = settings.public_dict()
    if args.output_format == "json":
        print(json.dumps(values, indent=2))
    else:
        print(_to_toml(values), end="")
    problems = file_problems(settings)
    for problem in problems:
        print(f"callbridge config check: {problem}", file=sys.stderr)
    return EXIT_USAGE if problems else EXIT_OK


def _to_toml(sections: dict[str, Any]) -> str:
    """The settings as TOML (``tomli-w``) that ``--config`` reads back. TOML has no null: an unset key is a comment,
    as is a secret (shown masked it would read back as the mask), both at their section's top."""
    import tomli_w

    parts = []
    for section, values in sections.items():
        notes: list[str] = []
        kept = _shown(values, "", notes)
        written = tomli_w.dumps({section: kept}).rstrip("\n").split("\n")
        header = written.index(f"[{section}]") if f"[{section}]" in written else -1
        parts.append("\n".join([*written[: header + 1], *notes, *written[header + 1 :]]) + "\n")
    return "\n".join(parts)


def _shown(value: Any, name: str, notes: list[str]) -> Any:
    """``value`` (named ``name`` within its section) without unset keys and secrets, each noted
    (``# registrations[0].password is set …``)."""
    from callbridge.config import MASK

    if isinstance(value, list):
        return [_shown(item, f"{name}[{index}]", notes) for index, item in enumerate(value)]
    if not isinstance(value, dict):
        return value
    kept = {}
    for key, item in value.items():
        child = f"{name}.{key}" if name else key
        if item is None:
            notes.append(f"# {child} is unset")
        elif item == MASK:
            notes.append(f"# {child} is set (a secret, not shown)")
        else:
            kept[key] = _shown(item, child, notes)
    return kept
