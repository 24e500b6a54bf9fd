"""Builds ``deploy/grafana/callbridge.json``, the Grafana dashboard over the bridge's Prometheus metrics, with Grafana's
own Foundation SDK (``grafana-foundation-sdk``: builders generated from Grafana's schemas, so what it writes is a
dashboard Grafana's schema takes).

    python deploy/grafana/build_dashboard.py            # rewrites callbridge.json
    python deploy/grafana/build_dashboard.py --check    # exit 1 where callbridge.json is not what this builds

Import: Grafana → Dashboards → New → Import → upload ``callbridge.json``, pick the Prometheus data source that scrapes
the bridges' ``/metrics``. Every query names a metric the bridge exports (``tests/test_grafana_dashboard.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import GraphDrawStyle, StackingMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef

OUT = Path(__file__).with_name("callbridge.json")
PROMETHEUS = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "[$__rate_interval]"
WIDTH, HEIGHT = 12, 8


def query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(PROMETHEUS)


def quantiles(metric: str, by: str = "") -> list[prometheus.Dataquery]:
    """p50 and p95 of a histogram, by ``by`` where given."""
    group = f"le, {by}" if by else "le"
    suffix = f" {{{{{by}}}}}" if by else ""
    return [
        query(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{RATE})))", f"p{round(q * 100)}{suffix}", ref)
        for q, ref in ((0.5, "A"), (0.95, "B"))
    ]


def graph(title: str, unit: str, targets: list[prometheus.Dataquery], description: str, *, stacked: bool = False) -> timeseries.Panel:
    panel = (
        timeseries.Panel().title(title).description(description).unit(unit).datasource(PROMETHEUS)
        .draw_style(GraphDrawStyle.LINE).line_width(1).fill_opacity(10).height(HEIGHT).span(WIDTH)
    )  # fmt: skip
    if stacked:
        panel = panel.stacking(_stacking())
    for target in targets:
        panel = panel.with_target(target)
    return panel


def tile(title: str, target: prometheus.Dataquery, description: str) -> stat.Panel:
    """One figure, a quarter of the row wide."""
    return stat.Panel().title(title).unit("short").datasource(PROMETHEUS).height(4).span(6).with_target(target).description(description)


def _stacking() -> common.StackingConfig:
    return common.StackingConfig().mode(StackingMode.NORMAL)


def build() -> dict[str, object]:
    board = (
        dashboard.Dashboard("callbridge").uid("callbridge").tags(["callbridge", "telephony", "voice"])
        .description("Calls, latency, barge-in, failures, the engine pool and the process, from the bridge's /metrics")
        .refresh("30s").time("now-6h", "now").timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    )  # fmt: skip
    board = board.with_row(dashboard.Row("Calls"))
    for title, expr, legend, description in (
        ("Calls up now", "sum(callbridge_calls_active)", "calls", "Calls with a live media stream, every bridge"),
        ("Engine sessions open", "sum(callbridge_engine_sessions_open)", "sessions", "Duplex sessions the bridges hold on the engine"),
        ("Detached sessions", "max(callbridge_detached_sessions)", "detached",
         "Sessions waiting for their call's stream to come back (a drop, a drain, a move)"),
        ("Refused in the last hour",
         "sum(increase(callbridge_streams_refused_total[1h])) + sum(increase(callbridge_admission_refused_total[1h]))",
         "refused", "Streams not bridged and calls not admitted"),
    ):  # fmt: skip
        board = board.with_panel(tile(title, query(expr, legend), description))
    board = board.with_panel(graph(
        "Calls up, by carrier", "short", [query("sum by (provider) (callbridge_calls_active)", "{{provider}}")],
        "Calls with a live media stream, by carrier (webrtc: the browser phone)", stacked=True,
    ))  # fmt: skip
    board = board.with_panel(graph(
        "Calls ended, by carrier and how", "cpm", [query(f"sum by (provider, end) (rate(callbridge_calls_total{RATE})) * 60", "{{provider}} {{end}}")],
        "Media streams ended per minute, by how they ended",
    ))  # fmt: skip
    board = board.with_row(dashboard.Row("Latency"))
    board = board.with_panel(graph(
        "Turn latency", "s", quantiles("callbridge_turn_latency_seconds", "provider"),
        "The caller stopped speaking → the agent's reply on its way (the engine's end-of-turn silence is in it)",
    ))  # fmt: skip
    board = board.with_panel(graph(
        "Carrier message handling (p50, p95)", "s", quantiles("callbridge_carrier_message_seconds"),
        "One inbound carrier message: parse, decode, resample, engine, what it sends (sampled one in 50)",
    ))  # fmt: skip
    board = board.with_panel(graph(
        "First caller audio to the engine", "s", quantiles("callbridge_first_audio_to_engine_seconds"),
        "A stream's first caller audio: read from the carrier → handed to the engine session",
    ))  # fmt: skip
    board = board.with_panel(graph(
        "Event loop lag", "s", [query(f"histogram_quantile(0.99, sum by (le) (rate(callbridge_event_loop_lag_seconds_bucket{RATE})))", "p99")],
        "How late the event loop runs a timer: every call's pacing waits on it",
    ))  # fmt: skip
    board = board.with_row(dashboard.Row("Barge-in and line quality"))
    board = board.with_panel(graph(
        "Barge-ins", "cpm", [
            query(f"sum by (provider) (rate(callbridge_barge_ins_total{RATE})) * 60", "{{provider}} barge-ins"),
            query(f"sum by (outcome) (rate(callbridge_barge_in_pauses_total{RATE})) * 60", "pauses: {{outcome}}", "B"),
        ], "Barge-in flushes, and (barge_in.mode = bridge) pauses by how they ended, per minute",
    ))  # fmt: skip
    board = board.with_panel(graph(
        "Barge-in: engine signal → carrier clear", "s", quantiles("callbridge_barge_in_clear_seconds"),
        "From the engine's interruption signal to the carrier's clear sent",
    ))  # fmt: skip
    board = board.with_panel(graph(
        "SIP call quality: MOS", "short", quantiles("callbridge_sip_call_mos", "codec"),
        "E-model MOS estimate of each SIP call at its end, by codec",
    ))  # fmt: skip
    board = board.with_panel(graph(
        "SIP network: jitter and round trip (p95)", "s", [
            query(f"histogram_quantile(0.95, sum by (le, codec) (rate(callbridge_sip_call_jitter_seconds_bucket{RATE})))", "jitter {{codec}}"),
            query(f"histogram_quantile(0.95, sum by (le, codec) (rate(callbridge_sip_call_round_trip_seconds_bucket{RATE})))", "round trip {{codec}}", "B"),
        ], "RTCP's figures at the end of each SIP call",
    ))  # fmt: skip
    board = board.with_row(dashboard.Row("Failures"))
    board = board.with_panel(graph(
        "Streams refused, by reason", "cpm", [query(f"sum by (provider, reason) (rate(callbridge_streams_refused_total{RATE})) * 60", "{{provider}} {{reason}}")],
        "Media streams not bridged (a bad token, capacity, draining, a browser that never connected)",
    ))  # fmt: skip
    board = board.with_panel(graph(
        "Engine failures and errors", "cpm", [
            query(f"sum by (reason) (rate(callbridge_engine_failures_total{RATE})) * 60", "failed mid-call: {{reason}}"),
            query(f"sum by (code) (rate(callbridge_engine_errors_total{RATE})) * 60", "error: {{code}}", "B"),
        ], "Calls whose engine session failed mid-call (failure tone, then hang-up), and the engine's error events",
    ))  # fmt: skip
    board = board.with_panel(graph(
        "Carrier protocol errors and hang-ups", "cpm", [
            query(f"sum by (provider, reason) (rate(callbridge_carrier_protocol_errors_total{RATE})) * 60", "{{provider}} {{reason}}"),
            query(f"sum by (provider, result) (rate(callbridge_hangups_total{RATE})) * 60", "hang-up {{provider}} {{result}}", "B"),
        ], "What carriers sent that their protocol does not allow; hang-ups through their REST APIs",
    ))  # fmt: skip
    board = board.with_panel(graph(
        "Audio gaps", "cpm", [
            query(f"sum by (provider) (rate(callbridge_playout_underruns_total{RATE})) * 60", "underruns {{provider}}"),
            query(f"sum by (provider) (rate(callbridge_late_audio_dropped_total{RATE})) * 60", "late dropped {{provider}}", "B"),
        ], "Agent audio that reached the carrier after its buffer ran dry; late engine audio dropped",
    ))  # fmt: skip
    board = board.with_row(dashboard.Row("Engine pool and process"))
    board = board.with_panel(graph(
        "Engine endpoints", "short", [
            query("sum by (endpoint) (callbridge_engine_endpoint_sessions)", "{{endpoint}} sessions"),
            query('sum by (endpoint) (callbridge_engine_endpoint_state{state!="healthy"})', "{{endpoint}} not healthy", "B"),
        ], "Sessions on each engine server, and the ones ejected or draining",
    ))  # fmt: skip
    board = board.with_panel(graph(
        "Admission and CPU", "percentunit", [
            query("max(callbridge_cpu_utilization)", "CPU (busiest bridge)"),
            query(f"sum by (reason) (rate(callbridge_admission_refused_total{RATE}))", "refused/s {{reason}}", "B"),
        ], "The bridges' CPU (what admission projects from) and calls refused by admission",
    ))  # fmt: skip
    built: dict[str, object] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    panels = built["panels"]
    assert isinstance(panels, list)
    for number, panel in enumerate(panels, 1):  # ids unique on the dashboard (the builders leave rows at 0, panels unset)
        panel["id"] = number
        for key in [key for key, value in panel.items() if value is None]:  # unset, not null: Grafana's defaults apply
            del panel[key]
    return built


def rendered() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with callbridge.json instead of writing it")
    args = parser.parse_args()
    text = rendered()
    if args.check:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is not what {Path(__file__).name} builds: run it", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
