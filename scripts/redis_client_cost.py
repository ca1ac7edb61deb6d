"""The client's CPU per Redis call (redis-py's command path and reply parsing), for the
commands the gateway and worker send most: with redis-py's own parser, or with hiredis
installed apart (``pip install --target DIR hiredis``, then ``PYTHONPATH=DIR``).

    python scripts/redis_client_cost.py [REDIS_URL]
"""

import asyncio
import sys
import time

import redis.asyncio as aioredis
from redis.utils import HIREDIS_AVAILABLE


async def main() -> None:
    url = sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:26379/0"
    r = aioredis.Redis.from_url(url, decode_responses=False)
    s = f"bench:parse:{time.time_ns()}"
    await r.xadd(s, {b"n": b"2", b"r": b"x" * 2048})
    script = r.register_script(
        "local o={} for i=1,#KEYS do o[i]=redis.call('EXISTS',KEYS[i]) end return o"
    )
    keys = [f"{s}:k{i}" for i in range(16)]
    out = {}
    for name, call in (
        ("xread 1 entry of 2 KiB", lambda: r.xread({s: "0-0"}, count=1)),
        ("script, 16 keys", lambda: script(keys=keys)),
        ("get", lambda: r.get(s + ":none")),
    ):
        for _ in range(200):
            await call()
        n = 3000
        t0 = time.process_time()
        for _ in range(n):
            await call()
        out[name] = (time.process_time() - t0) / n * 1e6
    await r.delete(s)
    await r.aclose()
    print(
        "hiredis" if HIREDIS_AVAILABLE else "pure   ",
        " | ".join(f"{k}: {v:.1f} us" for k, v in out.items()),
    )


asyncio.run(main())
