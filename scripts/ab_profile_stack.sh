#!/bin/bash
# This tree against another checkout, side by side: scripts/profile_stack.sh of each,
# alternating, ROUNDS rounds (the same Kafka and Redis; the load generator of each side).
#
#   git worktree add ../base COMMIT && ln -s "$PWD/.venv" ../base/.venv   # and its models
#   scripts/ab_profile_stack.sh ../base identity kafka 64 3
#
# Each line: round, side (base/this), the requests and batches measured, the worker's CPU
# per request, and the load's rate and mean batch (profile_stack.sh's output).
set -u
BASE=$(cd "$1" && pwd); MODEL=$2; TARGET=$3; C=$4; ROUNDS=${5:-3}
THIS=$(cd "$(dirname "$0")/.." && pwd)
for r in $(seq 1 "$ROUNDS"); do for side in base this; do
  [ $side = base ] && dir=$BASE || dir=$THIS
  out=$("$dir/scripts/profile_stack.sh" "$MODEL" "$TARGET" "$C" 2>&1)
  echo "round $r $side: $(echo "$out" | grep '^requests') | $(echo "$out" | grep -E "^$TARGET ")"
done; done
