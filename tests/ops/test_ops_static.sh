#!/usr/bin/env bash
# Static validation of the operations files (ops/): the Dockerfile, the compose
# stack, the Kubernetes and KEDA manifests, the Prometheus alerts, the Grafana
# dashboard, the metrics contract and the runbook, checked against each other
# and against config/*.json. Needs only python3's standard library (no docker,
# no cluster); exits 77 (skipped) without python3.
set -euo pipefail
command -v python3 >/dev/null || { echo "test_ops_static: no python3, skipped"; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
exec python3 "$here/ops_static.py" "$here/../.."
