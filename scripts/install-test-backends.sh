#!/usr/bin/env bash
# Real backends and validators the telemetry tests use (tests/telemetry). Idempotent.
#   - Prometheus + promtool (Debian package): scrapes the sidecar's /metrics in tests, checks deploy/prometheus.yml
#   - Alertmanager + amtool (Debian's prometheus-alertmanager): the alert chain's tests (tests/alert_chain.py),
#     checks deploy/alertmanager.yml
#   - check-jsonschema: validates docker-compose.yml against the compose specification's schema
#   - opentelemetry-exporter-prometheus: the reference for the sidecar's metric name translation
#   - grafana-foundation-sdk (pinned build): dashboards/generate.py
#   - arize-phoenix: a real OTLP trace backend for the end-to-end trace test (SKIP_PHOENIX=1 to leave it out),
#     in its own virtual environment .venv/phoenix: it needs fastapi>=0.142, vLLM 0.32 pins fastapi<0.137
#   - moto's standalone server (moto[server]): an S3-compatible store as its own process for the object-storage
#     tests (tests/test_store_moto.py) and benchmarks/bench_store.py (SKIP_MOTO=1 to leave it out), in its own
#     virtual environment .venv/moto: its pins (werkzeug, flask, boto3) are not vLLM's concern
set -euo pipefail
PYTHON="${PYTHON:-.venv/bin/python}"

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null \
    || ! command -v amtool >/dev/null; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get install -y --no-install-recommends prometheus prometheus-alertmanager || {
    $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends prometheus prometheus-alertmanager
  }
fi
# The Debian packages start a system Prometheus on :9090 and Alertmanager on :9093 where systemd runs;
# the tests start their own.

pkgs=(check-jsonschema "opentelemetry-exporter-prometheus==0.66b2" "grafana-foundation-sdk==1769699379!11.6.0")
"$PYTHON" -m pip install --quiet "${pkgs[@]}"
if [ "${SKIP_PHOENIX:-0}" != "1" ]; then
  PHOENIX_VENV="$(dirname "$(dirname "$PYTHON")")/phoenix"
  if ! "$PHOENIX_VENV/bin/python" -c "import phoenix.server.main" 2>/dev/null; then
    "$PYTHON" -m venv "$PHOENIX_VENV" 2>/dev/null || python3 -m venv "$PHOENIX_VENV"
    "$PHOENIX_VENV/bin/python" -m pip install --quiet arize-phoenix
  fi
fi
if [ "${SKIP_MOTO:-0}" != "1" ]; then
  MOTO_VENV="$(dirname "$(dirname "$PYTHON")")/moto"
  if [ ! -x "$MOTO_VENV/bin/moto_server" ]; then
    "$PYTHON" -m venv "$MOTO_VENV" 2>/dev/null || python3 -m venv "$MOTO_VENV"
    "$MOTO_VENV/bin/python" -m pip install --quiet "moto[server]>=5.2,<5.3"
  fi
fi
echo "test backends ready: $(prometheus --version 2>&1 | head -1); $(prometheus-alertmanager --version 2>&1 | head -1)"
