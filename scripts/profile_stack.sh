#!/bin/bash
# CPU per request of a worker and a gateway under load, and (PROF=1) their cProfile profiles.
# Prints the requests and batches (executions) served while measured, the worker's CPU, and
# the worker's CPU by thread per request and per batch (scripts/thread_cpu.py).
#
#   scripts/profile_stack.sh MODEL TARGET CONCURRENCY [SPINNING]
#   PROF=1 scripts/profile_stack.sh identity kafka 64
#   PROF=thread scripts/profile_stack.sh identity kafka 8   # loop threads' CPU, window only
#   scripts/profile_stack.sh mlp http-json 16 1        # ORT spinning on (1) / off (0)
#
# Runs on a Kafka and Redis that already run (PLAZA_KAFKA__BOOTSTRAP_SERVERS,
# PLAZA_REDIS__URL; defaults below), under a fresh prefix: one worker of MODEL and one
# gateway (ports 18100-18102), a warm-up, then `plaza loadgen` (2 s windows, at most 4).
# CPU is read from /proc before and after; requests from the statistics API. Output under
# var/profile/MODEL-TARGET-cC-sS-pP/ (cpu.txt, threads.txt, load.*, *.prof with PROF=1;
# read them with scripts/profile_by_package.py; PROF=thread: scripts/thread_profile.py's
# profiles of the loop threads' CPU in the measured window alone, worker.thread.prof and
# gateway.thread.prof). The gateway stops on SIGINT (uvicorn re-raises SIGTERM, which
# would skip cProfile's dump). SERVER_VENV=DIR runs the worker and the gateway on
# another venv's interpreter (an interpreter A/B); the load generator stays on .venv.
set -u
cd "$(dirname "$0")/.."
MODEL=$1; TARGET=$2; C=$3; SPIN=${4:-x}
export PLAZA_KAFKA__BOOTSTRAP_SERVERS=${PLAZA_KAFKA__BOOTSTRAP_SERVERS:-127.0.0.1:29092}
export PLAZA_REDIS__URL=${PLAZA_REDIS__URL:-redis://127.0.0.1:26379/0}
P=prof$RANDOM
export PLAZA_KAFKA__TOPIC_PREFIX=$P. PLAZA_REDIS__KEY_PREFIX=$P: PLAZA_LOG_LEVEL=WARNING
export PLAZA_WORKER__METRICS_PORT=-1 PLAZA_GATEWAY__HTTP_PORT=18100
export PLAZA_GATEWAY__GRPC_PORT=18101 PLAZA_GATEWAY__METRICS_PORT=18102 PLAZA_GATEWAY__MODELS=$MODEL
[ "$SPIN" = x ] || export PLAZA_WORKER__ORT_INTRA_OP_SPINNING=$SPIN
O=var/profile/$MODEL-$TARGET-c$C-s$SPIN-p${PROF:-0}; mkdir -p "$O"
SERVER_PY=${SERVER_VENV:-.venv}/bin/python
if [ "${PROF:-0}" = 1 ]; then WP="-m cProfile -o $O/worker.prof"; GP="-m cProfile -o $O/gateway.prof"; else WP=; GP=; fi
if [ "${PROF:-0}" = thread ]; then
  WM="scripts/thread_profile.py $O/worker.thread.prof"; GM="scripts/thread_profile.py $O/gateway.thread.prof"
else WM="-m plaza.cli.main"; GM="-m plaza.cli.main"; fi
$SERVER_PY $WP $WM worker --worker.model "$MODEL" > "$O/worker.log" 2>&1 & W=$!
$SERVER_PY $GP $GM gateway > "$O/gateway.log" 2>&1 & G=$!
trap 'kill -TERM $W 2>/dev/null; kill -INT $G 2>/dev/null' EXIT
sleep 12
stat() { curl -s "http://127.0.0.1:18100/v2/models/$MODEL/stats" | .venv/bin/python -c \
  "import json,sys; print(json.load(sys.stdin)['model_stats'][0]$1)"; }
count() { stat "['inference_stats']['success']['count']"; }
runs() { stat "['execution_count']"; }
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
load() { .venv/bin/python -m plaza.cli.main loadgen -m "$MODEL" --target "$TARGET" \
  --url http://127.0.0.1:18100 --concurrency "$C" --no-progress --no-plot "$@"; }
load --window-s 1 --warmup-s 1 --max-windows 2 > /dev/null 2>&1
window() { [ "${PROF:-0}" = thread ] && kill "-$1" $W $G; }
window USR2; .venv/bin/python scripts/thread_cpu.py snap $W > "$O/threads0.json"
w0=$(cpu $W); g0=$(cpu $G); n0=$(count); b0=$(runs)
load --window-s 2 --warmup-s 0.5 --max-windows 4 --out "$O/load" > "$O/load.txt" 2>&1
w1=$(cpu $W); g1=$(cpu $G); n1=$(count); b1=$(runs)
.venv/bin/python scripts/thread_cpu.py snap $W > "$O/threads1.json"; window USR1
n=$((n1 - n0)); b=$((b1 - b0))
echo "requests $n batches $b worker_cpu_ms $(( (w1-w0)*10 )) worker_us_per_req $(( (w1-w0)*10000 / (n>0?n:1) )) gateway_us_per_req $(( (g1-g0)*10000 / (n>0?n:1) ))" | tee "$O/cpu.txt"
.venv/bin/python scripts/thread_cpu.py diff "$O/threads0.json" "$O/threads1.json" $n $b | tee "$O/threads.txt"
grep -E "^(kafka|http)" "$O/load.txt"
kill -TERM $W 2>/dev/null; kill -INT $G 2>/dev/null; wait
trap - EXIT
