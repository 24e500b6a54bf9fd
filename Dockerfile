# callbridge: one bridge process, its per-frame modules compiled (mypyc). Build: docker build -t callbridge:0.1.0 .
# Run:   docker run --stop-timeout 45 -p 8080:8080 -e CALLBRIDGE_TWILIO__AUTH_TOKEN=... callbridge:0.1.0
#
# Stopping: SIGTERM drains (/readyz 503, calls move to other replicas or finish) for up to
# server.drain_timeout_s (30 s) before the process exits. Docker's default stop timeout is 10 s, after which it
# kills the process mid-call: give it more (docker run/stop --stop-timeout / -t 45; Compose: stop_grace_period: 45s;
# Kubernetes: terminationGracePeriodSeconds, deploy/kubernetes/bridge-deployment.yaml).
#
# Listeners: 8080/tcp HTTP (webhooks, media websockets, /healthz /readyz /metrics) is always on. Enabled in the
# configuration only: SIP 5060 (udp and tcp; [sip]), its RTP, one udp port per call (sip.rtp_port_min..max,
# 20000-20999; publishing a range this wide needs --network host in practice), Asterisk AudioSocket 9092/tcp
# ([audiosocket]). Each listener binds its `host` (127.0.0.1 by default): set it to 0.0.0.0 to reach it here.

# Build stage: the compiled build (README "The compiled build"): mypyc compiles the per-frame modules
# (callbridge/compiled.py) against the installed dependencies, so it needs them, mypy (the test extra) and a C
# compiler; it leaves the project's wheel and every dependency's in /wheels. The image below installs from those
# alone and has no compiler.
FROM python:3.11-slim AS build
# DL3008 asks for pinned Debian versions: the compiler is only the build stage's, and the slim base's own.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY callbridge ./callbridge
# DL3013 asks for pinned versions: this builds the project itself, whose pyproject.toml bounds its dependencies.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[test]" "setuptools>=77" \
    && CALLBRIDGE_COMPILE=1 pip wheel --no-cache-dir --no-build-isolation --wheel-dir /wheels ".[redis]"

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 callbridge \
    && useradd --system --uid 10001 --gid callbridge --home-dir /app --shell /usr/sbin/nologin callbridge

# libopus0: Opus for SIP calls where sip.codecs names it (callbridge/codecs/opus.py loads it; nothing else needs it).
# DL3008: Debian's own version of the slim base.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libopus0 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY config ./config
COPY --from=build /wheels /wheels
# The compiled wheel and its dependencies', nothing from an index. The redis extra: the fleet
# (registry.backend = "redis", deploy/kubernetes/configmap.yaml) needs its client. DL3013: the versions are the
# build stage's, the only ones in /wheels.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --no-index --find-links /wheels "callbridge[redis]" \
    && rm -rf /wheels /root/.cache

USER 10001:10001

ENV CALLBRIDGE_SERVER__HOST=0.0.0.0 \
    CALLBRIDGE_SERVER__PORT=8080 \
    CALLBRIDGE_LOG__FORMAT=json
EXPOSE 8080/tcp 5060/udp 5060/tcp 9092/tcp 20000-20999/udp

# Probes the port the server listens on: CALLBRIDGE_SERVER__PORT (env wins over a --config file's server.port).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('CALLBRIDGE_SERVER__PORT', '8080'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2).status == 200 else 1)"]

STOPSIGNAL SIGTERM
CMD ["callbridge", "serve"]
