#!/bin/bash
# uvicorn against granian as the HTTP front, side by side: scripts/profile_perf_analyzer.sh
# (HTTP, JSON tensors) with each server, alternating, ROUNDS rounds at each concurrency.
#
#   pip install --target /tmp/granian granian        # apart from the venv
#   GRANIAN_DIR=/tmp/granian scripts/ab_http_server.sh mlp "16 64" 3
#
# Each line: round, concurrency, server, perf_analyzer's rate and latency, and the
# worker's and gateway's CPU per request (granian's: its worker process included).
set -u
cd "$(dirname "$0")/.."
MODEL=$1; CS=${2:-"16 64"}; ROUNDS=${3:-3}
for r in $(seq 1 "$ROUNDS"); do for c in $CS; do for server in uvicorn granian; do
  out=$(HTTP_SERVER=$server scripts/profile_perf_analyzer.sh "$MODEL" http "$c" 2>&1)
  echo "round $r c=$c $server: $(echo "$out" | grep -E 'infer/s' | head -1) | $(echo "$out" | grep requests)"
done; done; done
