# syntax=docker/dockerfile:1
#
# txstage container images.
#
#   docker build -t txstage .                              # the stage (default target)
#   docker build --target backfill -t txstage-backfill .   # + PySpark and a JRE, for `txstage backfill`
#
# The stage image carries no Spark and no JVM: it stays small and starts fast.
# Runtime user is uid/gid 10001 (numeric, so Kubernetes can verify runAsNonRoot).

ARG PYTHON_IMAGE=python:3.11-slim

# --- base: what every final image shares --------------------------------------
FROM ${PYTHON_IMAGE} AS base
RUN groupadd --system --gid 10001 txstage \
 && useradd --system --uid 10001 --gid txstage --no-create-home \
            --home-dir /nonexistent --shell /usr/sbin/nologin txstage
ENV PATH=/opt/txstage/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# --- build: a virtualenv with txstage and its runtime dependencies ------------
# confluent-kafka ships manylinux wheels with librdkafka inside: no compiler needed.
FROM base AS build
RUN python -m venv /opt/txstage
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
RUN pip install ".[schemas]"

# --- build-spark: the same virtualenv plus the spark extra ---------------------
FROM build AS build-spark
RUN pip install ".[spark,schemas]"

# --- backfill: `txstage backfill` on PySpark (needs a JRE) ---------------------
# No Spark Kafka connector: tasks read and write Kafka with librdkafka, so the image
# needs no Maven and fetches nothing at run time (no network beyond the broker).
FROM base AS backfill
# Slim bases drop man pages; the JRE's post-install links into man1 and fails without it.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install --yes --no-install-recommends default-jre-headless \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-spark /opt/txstage /opt/txstage
ENV TXSTAGE_LOG_FORMAT=json
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["txstage"]
CMD ["backfill", "--help"]

# --- runtime (default): the stream stage ----------------------------------------
FROM base AS runtime
COPY --from=build /opt/txstage /opt/txstage
USER 10001:10001
WORKDIR /tmp
ENV TXSTAGE_METRICS_PORT=9108 \
    TXSTAGE_LOG_FORMAT=json
EXPOSE 9108
# SIGTERM starts the clean shutdown: commit open transactions, leave the group, exit 0.
STOPSIGNAL SIGTERM
# No curl in slim images; the stdlib is enough. urlopen raises on 503, so the exit code says it.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('TXSTAGE_METRICS_PORT', '9108'), timeout=4)" || exit 1
ENTRYPOINT ["txstage"]
CMD ["run"]
