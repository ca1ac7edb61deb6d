"""What an HTTP front costs per request before any work: three servers that read a KServe
infer body and answer one canned JSON response, driven by wrk (POST of the mlp's 512-value
JSON request) at a fixed concurrency; the server's CPU per request from /proc.

    python scripts/http_front_cost.py [--seconds 6] [--connections 16,64] [--rounds 2]

The fronts: ``starlette`` (Starlette on uvicorn, the gateway's stack before the fast
path), ``asgi`` (a bare ASGI callable on uvicorn), ``protocol`` (plaza.gateway's own
httptools protocol, ``plaza.gateway.http_server``). wrk comes from Debian's ``wrk``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from plaza.stack.ports import accepts, free_port

FRONTS = ("starlette", "asgi", "protocol")
ANSWER = json.dumps(
    {
        "model_name": "mlp",
        "model_version": "1",
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 10], "data": [0.125] * 10}],
    }
).encode()
BODY = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 512], "data": [0.5] * 512}]}
)


def serve(front: str, port: int) -> None:
    """Run one canned front on 127.0.0.1:port until killed."""
    from plaza import event_loop, gc_tuning

    gc_tuning.tune()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]

    async def bare(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": ANSWER})

    if front == "protocol":
        from plaza.gateway.http_server import serve_canned

        event_loop.run(serve_canned("127.0.0.1", port, ANSWER))
        return
    import uvicorn

    from plaza.loadgen.baseline_server import uvicorn_config

    if front == "starlette":
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route

        async def infer(request: Request) -> Response:
            await request.body()
            return Response(ANSWER, media_type="application/json")

        app = Starlette(routes=[Route("/v2/models/{model}/infer", infer, methods=["POST"])])
    else:
        app = bare  # type: ignore[assignment]
    config = uvicorn_config(app, port, lifespan="off")
    event_loop.run(uvicorn.Server(config).serve())


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_port(port: int, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while not accepts(port):
        if time.monotonic() > end:
            raise RuntimeError(f"nothing listens on {port}")
        time.sleep(0.1)


def measure(front: str, connections: int, seconds: float, script: Path) -> dict[str, float]:
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", front, "--port", str(port)])
    try:
        _wait_port(port)
        url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
        warm = ["wrk", "-t1", f"-c{connections}", "-d2s", "-s", str(script), url]
        subprocess.run(warm, check=True, capture_output=True)
        before = _cpu_s(server.pid)
        cmd = ["wrk", "-t1", f"-c{connections}", f"-d{int(seconds)}s", "-s", str(script), url]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        cpu = _cpu_s(server.pid) - before
    finally:
        server.kill()
        server.wait()
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"{front}: wrk saw errors:\n{out}")
    return {"rps": requests / seconds, "us_per_request": cpu / requests * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", choices=FRONTS)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--connections", default="16,64")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fronts", default=",".join(FRONTS))
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return 0
    if shutil.which("wrk") is None:
        print("http_front_cost: needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(
            'wrk.method = "POST"\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = {json.dumps(BODY)}\n"
        )
        fronts = args.fronts.split(",")
        rows = []
        for conns in (int(c) for c in args.connections.split(",")):
            for r in range(args.rounds):
                order = fronts if r % 2 == 0 else fronts[::-1]  # ABBA
                for front in order:
                    m = measure(front, conns, args.seconds, script)
                    rows.append({"front": front, "connections": conns, "round": r, **m})
                    print(
                        f"c={conns:<3} round {r} {front:<10} {m['rps']:>9,.0f} req/s "
                        f"{m['us_per_request']:>7.1f} us CPU/request",
                        flush=True,
                    )
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
