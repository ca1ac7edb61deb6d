#!/bin/bash
# This tree against another checkout, side by side: scripts/profile_perf_analyzer.sh of each,
# alternating, ROUNDS rounds at each concurrency (the same Kafka, Redis and models).
#
#   git worktree add ../base COMMIT && ln -s "$PWD/.venv" ../base/.venv   # and its models
#   scripts/ab_perf_analyzer.sh ../base mlp http "16 64" 3
#
# Each line: round, concurrency, side (base/this), perf_analyzer's rate and latency, and the
# worker's and gateway's CPU per request, and the worker's mean batch size.
set -u
BASE=$(cd "$1" && pwd); MODEL=$2; PROTO=$3; CS=${4:-"16 64"}; ROUNDS=${5:-3}
THIS=$(cd "$(dirname "$0")/.." && pwd)
for r in $(seq 1 "$ROUNDS"); do for c in $CS; do for side in base this; do
  [ $side = base ] && dir=$BASE || dir=$THIS
  out=$("$dir/scripts/profile_perf_analyzer.sh" "$MODEL" "$PROTO" "$c" 2>&1)
  echo "round $r c=$c $side: $(echo "$out" | grep -E 'infer/s' | head -1) | $(echo "$out" | grep requests) | $(echo "$out" | grep 'mean batch')"
done; done; done
