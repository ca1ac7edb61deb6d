"""The client's CPU per Redis call (redis-py's command path and reply parsing), for the
commands the gateway and worker send most (the last is the worker's write of a batch of 64
results): with hiredis (a dependency), or with redis-py's own parser and packer when a
``hiredis.py`` that raises ImportError is put first on ``PYTHONPATH``.

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
    # The worker's write of one batch: one script call, 64 result keys, a payload each.
    write = r.register_script("return #ARGV")
    wkeys = [f"{s}:r{i}" for i in range(64)]
    wargs: list[bytes | int] = [300, 10000, 600, 64]
    for _ in range(64):
        wargs += [b"p" * 120, 1]
    out = {}
    for name, call in (
        ("xread 1 entry of 2 KiB", lambda: r.xread({s: "0-0"}, count=1)),
        ("script, 16 keys", lambda: script(keys=keys)),
        ("get", lambda: r.get(s + ":none")),
        ("script, 64 keys and 128 args", lambda: write(keys=wkeys, args=wargs)),
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
