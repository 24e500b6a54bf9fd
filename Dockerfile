# callbridge: one bridge process. Build: docker build -t callbridge .
# Run:   docker run -p 8080:8080 -e CALLBRIDGE_TWILIO__AUTH_TOKEN=... callbridge
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 callbridge \
    && useradd --system --uid 10001 --gid callbridge --home-dir /app --shell /usr/sbin/nologin callbridge

WORKDIR /app
COPY pyproject.toml README.md ./
COPY callbridge ./callbridge
COPY config ./config
RUN pip install --no-cache-dir . \
    && rm -rf /root/.cache

USER 10001:10001

ENV CALLBRIDGE_SERVER__HOST=0.0.0.0 \
    CALLBRIDGE_SERVER__PORT=8080 \
    CALLBRIDGE_LOG__FORMAT=json
EXPOSE 8080

HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]

STOPSIGNAL SIGTERM
CMD ["callbridge", "serve"]
