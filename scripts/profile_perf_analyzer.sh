#!/bin/bash
# CPU per request of a worker and a gateway under Triton's perf_analyzer (HTTP or gRPC),
# and (PROF=1) the gateway's cProfile profile: the gRPC front against the HTTP one.
#
#   scripts/profile_perf_analyzer.sh MODEL grpc|http CONCURRENCY
#   PROF=1 scripts/profile_perf_analyzer.sh mlp grpc 16
#   HTTP_SERVER=granian GRANIAN_DIR=/tmp/granian scripts/profile_perf_analyzer.sh mlp http 16
#   SHM=system scripts/profile_perf_analyzer.sh mlp http 16   # tensors in system shared memory
#   SEQ_LEN=10 scripts/profile_perf_analyzer.sh accumulate grpc 32   # sequences of 10 requests
#   TRACE_RATE=20 scripts/profile_perf_analyzer.sh mlp http 16   # one request in 20 traced
#
# TRACE_RATE=N turns on Triton's trace extension (TIMESTAMPS) for one request in N; the
# trace lines go to var/profile/.../traces/trace.jsonl, and scripts/trace_stages.py reads
# the stages' means from them.
#
# HTTP_SERVER=granian serves the HTTP front (only it: no gRPC) under granian instead of
# uvicorn (scripts/granian_front.py; granian installed apart with pip --target GRANIAN_DIR).
#
# As scripts/profile_stack.sh (a Kafka and Redis that already run, a fresh prefix, one
# worker and one gateway on ports 18110-18112), but the load is perf_analyzer (sync calls,
# JSON tensors over HTTP, raw over gRPC; `make bench-tools` installs it), 3 windows of 2 s.
# Output under var/profile/pa-MODEL-PROTO-cC-pP/ (cpu.txt, pa.txt, threads.txt: the
# gateway's CPU per request by thread name, gateway.prof).
set -u
cd "$(dirname "$0")/.."
MODEL=$1; PROTO=$2; C=$3
export PLAZA_KAFKA__BOOTSTRAP_SERVERS=${PLAZA_KAFKA__BOOTSTRAP_SERVERS:-127.0.0.1:29092}
export PLAZA_REDIS__URL=${PLAZA_REDIS__URL:-redis://127.0.0.1:26379/0}
P=prof$RANDOM
export PLAZA_KAFKA__TOPIC_PREFIX=$P. PLAZA_REDIS__KEY_PREFIX=$P: PLAZA_LOG_LEVEL=WARNING
export PLAZA_WORKER__METRICS_PORT=-1 PLAZA_GATEWAY__HTTP_PORT=18110
export PLAZA_GATEWAY__GRPC_PORT=18111 PLAZA_GATEWAY__METRICS_PORT=18112 PLAZA_GATEWAY__MODELS=$MODEL
SHM=${SHM:-none}
[ "$SHM" = none ] || export PLAZA_GATEWAY__ALLOW_CLIENT_SHM=true
O=var/profile/pa-$MODEL-$PROTO-c$C-p${PROF:-0}-${HTTP_SERVER:-uvicorn}-shm$SHM; mkdir -p "$O"
if [ -n "${TRACE_RATE:-}" ]; then
  export PLAZA_GATEWAY__TRACE_DIR=$PWD/$O/traces; mkdir -p "$O/traces"; rm -f "$O/traces/trace.jsonl"
fi
if [ "${PROF:-0}" = 1 ]; then GP="-m cProfile -o $O/gateway.prof"; else GP=; fi
.venv/bin/python -m plaza.cli.main worker --worker.model "$MODEL" > "$O/worker.log" 2>&1 & W=$!
if [ "${HTTP_SERVER:-uvicorn}" = granian ]; then
  PYTHONPATH=${GRANIAN_DIR:-/tmp/granian}:scripts .venv/bin/python -m granian --interface asgi \
    --loop uvloop --workers 1 --host 127.0.0.1 --port 18110 --no-ws --log-level warning \
    --factory granian_front:app_factory > "$O/gateway.log" 2>&1 & G=$!
else
  .venv/bin/python $GP -m plaza.cli.main gateway > "$O/gateway.log" 2>&1 & G=$!
fi
trap 'kill -TERM $W 2>/dev/null; kill -INT $G 2>/dev/null' EXIT
sleep 12
if [ -n "${TRACE_RATE:-}" ]; then
  curl -s -X POST http://127.0.0.1:18110/v2/trace/setting -d "{\"trace_level\": [\"TIMESTAMPS\"], \
    \"trace_rate\": \"$TRACE_RATE\", \"trace_file\": \"trace.jsonl\"}" > /dev/null
fi
count() { curl -s "http://127.0.0.1:18110/v2/models/$MODEL/stats" | .venv/bin/python -c \
  "import json,sys; print(json.load(sys.stdin)['model_stats'][0]['inference_stats']['success']['count'])"; }
# a process's CPU ticks, its children's included (granian serves from a child process)
cpu() { local t; t=$(awk '{print $14+$15}' "/proc/$1/stat"); for k in $(pgrep -P "$1"); do
  t=$((t + $(cpu "$k"))); done; echo "$t"; }
[ "$PROTO" = grpc ] && ADDR=127.0.0.1:18111 || ADDR=127.0.0.1:18110
.venv/bin/python - "$MODEL" "$O/input.json" <<'PY'
import sys
from pathlib import Path
from plaza.loadgen.inputs import input_pool
from plaza.loadgen.perf_analyzer import write_input_data
from plaza.model_control import model_spec
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
spec = model_spec(ModelRepository(PlazaSettings().repository), sys.argv[1], None)
write_input_data(input_pool(spec), Path(sys.argv[2]))
PY
threads() { for t in /proc/$1/task/*; do echo "$(cat $t/comm | tr ' ' _) $(awk '{print $14+$15}' $t/stat)"; done | sort; }
threads $G > "$O/threads0.txt"
# perf_analyzer's own CPU (user + system seconds, over its whole run, warm-up included)
PA=$(.venv/bin/python -c "from plaza.loadgen import perf_analyzer as p; print(p.binary_path())")
printf '#!/bin/bash\nexec /usr/bin/time -o %s -f "%%U %%S" %s "$@"\n' "$PWD/$O/pa_cpu.txt" "$PA" > "$O/pa.sh"
chmod +x "$O/pa.sh"; export PLAZA_PERF_ANALYZER=$PWD/$O/pa.sh
w0=$(cpu $W); g0=$(cpu $G); n0=$(count)
# PERF=1: `perf record` the gateway's main thread for 6 s of the run (perf report -i ...)
[ "${PERF:-0}" = 1 ] && (sleep 3; perf record -q -t $G -o "$O/perf.data" -- sleep 6 > /dev/null 2>&1) &
.venv/bin/python - "$MODEL" "$ADDR" "$PROTO" "$C" "$O/input.json" "$SHM" "${SEQ_LEN:-0}" > "$O/pa.txt" 2>&1 <<'PY'
import sys
from pathlib import Path
from plaza.loadgen import perf_analyzer as pa
m, addr, proto, c, data, shm, seq = sys.argv[1:]
r = pa.run(m, addr, proto, int(c), Path(data), shared_memory=shm, sequence_length=int(seq))
print(f"{proto} shm={shm} c={c} infer/s {r.throughput:.0f} p50 {r.p50_ms:.2f} ms p99 {r.p99_ms:.2f} ms")
PY
w1=$(cpu $W); g1=$(cpu $G); n1=$(count)
n=$((n1 - n0))
threads $G > "$O/threads1.txt"
# the gateway's CPU by thread name (ticks of 10 ms summed over threads of that name)
join -a1 <(awk '{a[$1]+=$2} END {for (k in a) print k, a[k]}' "$O/threads1.txt" | sort) \
  <(awk '{a[$1]+=$2} END {for (k in a) print k, a[k]}' "$O/threads0.txt" | sort) \
  | awk -v n=$n '{d=$2-($3==""?0:$3); if (d>0) printf "gateway thread %s: %d us/request\n", $1, d*10000/(n>0?n:1)}' \
  | tee "$O/threads.txt"
echo "requests $n worker_us_per_req $(( (w1-w0)*10000 / (n>0?n:1) )) gateway_us_per_req $(( (g1-g0)*10000 / (n>0?n:1) ))" | tee "$O/cpu.txt"
cat "$O/pa.txt"
# where a request's time went inside the worker (the statistics API, Triton's fields), µs
curl -s "http://127.0.0.1:18110/v2/models/$MODEL/stats" > "$O/stats.json"
.venv/bin/python -c '
import json, sys
m = json.load(open(sys.argv[1]))["model_stats"][0]
s = m["inference_stats"]
n = max(1, s["success"]["count"])
print("worker per request (us): " + ", ".join(
    k + " %.0f" % (s[k]["ns"] / n / 1000) for k in ("queue", "compute_input", "compute_infer", "compute_output")))
print("mean batch %.1f" % (m["inference_count"] / max(1, m["execution_count"])))
' "$O/stats.json" | tee "$O/stats.txt"
awk -v n=$n '{printf "perf_analyzer cpu %.1f s (%d us/request counted)\n", $1+$2, ($1+$2)*1e6/(n>0?n:1)}' "$O/pa_cpu.txt" 2>/dev/null
kill -TERM $W; kill -INT $G; wait
trap - EXIT
