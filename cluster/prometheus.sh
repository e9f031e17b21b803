#!/usr/bin/env bash
# Prometheus for a Ray cluster's metrics (rayward's ray_rayward_* series, Ray's own), run on the head node.
#
# Ray lists every node's metrics endpoint (each node's --metrics-export-port, plus the dashboard's and the
# autoscaler's) in its service-discovery file, <Ray temp dir>/prom_metrics_service_discovery.json, and keeps
# it current as nodes join and leave and across `ray start` restarts. This is the scrape configuration Ray
# generates (<Ray temp dir>/session_latest/metrics/prometheus/prometheus.yml) pointed at that stable file
# instead of one session's copy. `ray metrics launch-prometheus` does the same but downloads Prometheus first.
#
#   bash cluster/prometheus.sh                  # in the foreground; UI and API on http://127.0.0.1:9090
#   bash cluster/prometheus.sh --print-config   # print the configuration and exit
#
# Settings (environment variables):
#   RAY_TEMP_DIR        Ray's temp dir on this node (`ray start --temp-dir`; default /tmp/ray)
#   PROMETHEUS_ADDRESS  listen address (default 127.0.0.1:9090, where Ray's dashboard looks by default; see
#                       RAY_PROMETHEUS_HOST). Use 0.0.0.0:9090 only behind a firewall: there is no auth.
#   PROMETHEUS_DATA     data directory, config included (default ./prometheus-data)
#   SCRAPE_INTERVAL     default 10s (Ray's nodes export every 10 s)
#   SD_REFRESH          how often the service-discovery file is re-read (default: SCRAPE_INTERVAL). Ray keeps
#                       that file as a symlink to the session's copy and updates the copy, which a file watch on
#                       the symlink's directory never sees: only this re-read finds a node that joined (or the
#                       head's own metrics port, listed a few seconds after Ray starts).
#   PROMETHEUS          the binary (default: `prometheus` on PATH; Debian/Ubuntu: apt-get install prometheus)
set -euo pipefail

RAY_TEMP_DIR=${RAY_TEMP_DIR:-/tmp/ray}
PROMETHEUS_ADDRESS=${PROMETHEUS_ADDRESS:-127.0.0.1:9090}
PROMETHEUS_DATA=${PROMETHEUS_DATA:-prometheus-data}
SCRAPE_INTERVAL=${SCRAPE_INTERVAL:-10s}
SD_REFRESH=${SD_REFRESH:-$SCRAPE_INTERVAL}
PROMETHEUS=${PROMETHEUS:-prometheus}

config() {
  cat <<EOF
global:
  scrape_interval: ${SCRAPE_INTERVAL}
  evaluation_interval: ${SCRAPE_INTERVAL}
scrape_configs:
  - job_name: ray
    file_sd_configs:
      - files: ['${RAY_TEMP_DIR}/prom_metrics_service_discovery.json']
        refresh_interval: ${SD_REFRESH}
EOF
}

if [ "${1:-}" = "--print-config" ]; then
  config
  exit 0
fi
if ! command -v "$PROMETHEUS" >/dev/null 2>&1; then
  echo "cluster/prometheus.sh: no '$PROMETHEUS' binary; install it (Debian/Ubuntu: apt-get install prometheus," \
       "or a release from https://prometheus.io/download/) or set PROMETHEUS=/path/to/prometheus" >&2
  exit 1
fi
if [ ! -e "$RAY_TEMP_DIR/prom_metrics_service_discovery.json" ]; then
  echo "cluster/prometheus.sh: $RAY_TEMP_DIR/prom_metrics_service_discovery.json does not exist yet (is Ray's" \
       "head running here with its dashboard?); Prometheus picks it up when it appears" >&2
fi
mkdir -p "$PROMETHEUS_DATA"
config > "$PROMETHEUS_DATA/prometheus.yml"
echo "cluster/prometheus.sh: scraping the nodes listed in $RAY_TEMP_DIR/prom_metrics_service_discovery.json;" \
     "http://$PROMETHEUS_ADDRESS" >&2
exec "$PROMETHEUS" --config.file="$PROMETHEUS_DATA/prometheus.yml" --storage.tsdb.path="$PROMETHEUS_DATA" \
  --web.listen-address="$PROMETHEUS_ADDRESS"
