#!/bin/bash
# A worker's CPU per request when it drains a backlog (full batches), without a gateway.
#
#   scripts/drain_bench.sh [MODEL] [REQUESTS]        # identity 20000
#
# On a Kafka and Redis that already run, under a fresh prefix: one worker of MODEL (ready
# and idle first), then REQUESTS requests published at once with the SDK's publish_many
# (no reply stream: results go under their result keys), then the worker's CPU (/proc)
# until its statistics count them all. The load generator runs before the worker's CPU is
# read, so its CPU is not the worker's; the worker sees a backlog and forms full batches,
# so the figure is less at the mercy of arrival timing than a closed-loop run's.
set -u
cd "$(dirname "$0")/.."
MODEL=${1:-identity}; N=${2:-20000}
export PLAZA_KAFKA__BOOTSTRAP_SERVERS=${PLAZA_KAFKA__BOOTSTRAP_SERVERS:-127.0.0.1:29092}
export PLAZA_REDIS__URL=${PLAZA_REDIS__URL:-redis://127.0.0.1:26379/0}
P=drain$RANDOM
export PLAZA_KAFKA__TOPIC_PREFIX=$P. PLAZA_REDIS__KEY_PREFIX=$P: PLAZA_LOG_LEVEL=WARNING
export PLAZA_WORKER__METRICS_PORT=-1 PLAZA_WORKER__HEARTBEAT_INTERVAL_S=0.25
O=var/profile/drain-$MODEL; mkdir -p "$O"
.venv/bin/python -m plaza.cli.main worker --worker.model "$MODEL" > "$O/worker.log" 2>&1 & W=$!
trap 'kill -TERM $W 2>/dev/null' EXIT
.venv/bin/python - "$MODEL" "$N" "$W" <<'PY'
import asyncio, sys, time
import numpy as np
from plaza.client import PlazaClient, make_request
from plaza.connections import redis_client
from plaza.loadgen.inputs import input_pool
from plaza.model_control import model_spec
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings

model, n, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def cpu() -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100

async def answered(redis, key) -> int:
    return int(await redis.hget(key, "success.count") or 0)

async def main() -> None:
    s = PlazaSettings()
    spec = model_spec(ModelRepository(s.repository), model)
    pool = input_pool(spec)
    redis = redis_client(s.redis)
    key = s.names.model_stats_key(model, "1")
    async with PlazaClient(s) as client:
        await client.publish_many([make_request(model, pool[0])])  # the worker is ready
        for _ in range(600):
            if await answered(redis, key) >= 1:
                break
            await asyncio.sleep(0.1)
        reqs = [make_request(model, pool[i % len(pool)]) for i in range(n)]
        await asyncio.sleep(1.0)
        c0, t0 = cpu(), time.monotonic()
        await client.publish_many(reqs)
        while await answered(redis, key) < n + 1:
            await asyncio.sleep(0.05)
        c1, t1 = cpu(), time.monotonic()
    await redis.aclose()
    print(f"drain {model} {n}: worker {(c1 - c0) / n * 1e6:.1f} us/request, "
          f"{n / (t1 - t0):.0f} requests/s (publishing included)")

asyncio.run(main())
PY
kill -TERM $W; wait
trap - EXIT
