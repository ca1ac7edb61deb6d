"""``plaza up``: the whole engine on this machine, stopped together on Ctrl-C.

Starts Kafka (KRaft) and Redis on 127.0.0.1, one worker process per model instance
(instance_group count) for every model in the repository, and the gateway; waits until the
gateway is ready; prints where to send requests; on Ctrl-C or SIGTERM stops everything it
started, workers first (they drain and commit), services last.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from plaza.modelconfig import PLATFORM_TORCH
from plaza.repository import ModelRepository
from plaza.stack.local_services import KafkaCluster, RedisServer


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="plaza up", description=__doc__)
    p.add_argument("--repository", default="model_repository", type=Path)
    p.add_argument("--data-dir", default="var/up", type=Path)
    p.add_argument("--kafka-port", type=int, default=9092)
    p.add_argument("--redis-port", type=int, default=6379)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--metrics-port", type=int, default=8002, help="the gateway's Prometheus port")
    p.add_argument("--models", default="", help="comma-separated subset (default: all)")
    p.add_argument("--ready-timeout", type=float, default=180.0)
    return p.parse_args(argv)


def _worker_plan(repo: ModelRepository, only: set[str]) -> list[tuple[str, int]]:
    """(model, instance count) for every model to serve."""
    plan = []
    torch_ok = importlib.util.find_spec("torch") is not None
    for name in repo.model_names():
        if only and name not in only:
            continue
        spec = repo.spec(name)
        if spec.platform == PLATFORM_TORCH and not torch_ok:
            print(f"  skipping {name}: needs the torch extra (pip install '.[torch]')")
            continue
        repo.served_versions(name, spec)  # a missing model file fails here, clearly
        plan.append((name, spec.instance_count))
    return plan


def _wait_ready(url: str, procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(
                f"{len(dead)} process(es) exited during start: {[str(p.args) for p in dead]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"gateway not ready at {url} after {timeout:.0f}s")


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=40)
        except subprocess.TimeoutExpired:
            p.kill()


def run_up(argv: list[str]) -> int:
    args = _parse(argv)
    repo = ModelRepository(args.repository)
    plan = _worker_plan(repo, {m for m in args.models.split(",") if m})
    logs = args.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    kafka = KafkaCluster(args.data_dir / "kafka", port=args.kafka_port, fast_start=False)
    redis = RedisServer(args.data_dir / "redis", port=args.redis_port)
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    try:
        print("starting Kafka and Redis on 127.0.0.1 ...", flush=True)
        kafka.start()
        redis.start()
        kafka.wait_ready()
        redis.wait_ready()
        env = {
            **os.environ,
            "PLAZA_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "PLAZA_REDIS__URL": redis.url,
            "PLAZA_REPOSITORY": str(args.repository),
        }

        def spawn(name: str, *cmd: str) -> None:
            log = (logs / f"{name}.log").open("ab")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "plaza.cli.main", *cmd],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

        for model, count in plan:
            for i in range(count):
                spawn(f"worker-{model}-{i}", "worker", "--worker.model", model)
        spawn(
            "gateway",
            "gateway",
            "--gateway.http_port",
            str(args.http_port),
            "--gateway.metrics_port",
            str(args.metrics_port),
        )
        base = f"http://127.0.0.1:{args.http_port}"
        print(
            f"starting {sum(c for _, c in plan)} workers for {[m for m, _ in plan]} "
            f"and the gateway (logs in {logs}) ...",
            flush=True,
        )
        _wait_ready(f"{base}/v2/health/ready", procs, args.ready_timeout)
        _print_banner(base, kafka.bootstrap_servers, redis.url, [m for m, _ in plan])
        while not stopping:
            if any(p.poll() is not None for p in procs):
                print("a Plaza process exited; stopping everything (see the logs)", flush=True)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping ...", flush=True)
        _stop_all(procs)
        redis.stop()
        kafka.stop()
        print("stopped.", flush=True)
    return 0


def _print_banner(base: str, kafka: str, redis: str, models: list[str]) -> None:
    example = (
        f"curl -s {base}/v2/models/add_sub/infer -H 'content-type: application/json' "
        '-d \'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32",'
        '"data":[' + ",".join(["1"] * 16) + ']},{"name":"INPUT1","shape":[1,16],'
        '"datatype":"INT32","data":[' + ",".join(["2"] * 16) + "]}]}'"
    )
    print(
        f"""
Plaza is up.
  HTTP (KServe v2):  {base}/v2          models: {", ".join(models)}
  health:            {base}/v2/health/ready
  Kafka:             {kafka}   (topics plaza.infer.<model>)
  Redis:             {redis}
Try:
  {example}
Ctrl-C stops everything.
""",
        flush=True,
    )
