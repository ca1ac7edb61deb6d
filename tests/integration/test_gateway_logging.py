"""The single-process gateway (``run_gateway``, gateway.workers 1) sets up logging: its
startup line says where it listens, at the deployment's log level (it logged nothing)."""

from __future__ import annotations

import re
from pathlib import Path

from plaza.stack import Deployment, GatewayProcess, ProcessGroup, free_port, new_prefix
from tests.support import wait_for


async def test_a_single_gateway_process_logs_where_it_listens(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    # gateway.workers 1 (run_gateway's own path): its startup line, at INFO, is the only
    # place a free port chosen for gRPC (0) is named.
    repo = tmp_path / "repo"
    repo.mkdir()
    dep = Deployment(kafka_bootstrap, redis_url, repo, new_prefix("tgwlog"), log_level="INFO")
    procs = ProcessGroup(tmp_path / "logs")
    http_port = free_port()
    gateway = GatewayProcess(
        dep, http_port, procs.log_dir, env={"PLAZA_GATEWAY__MODEL_CONTROL_MODE": "explicit"}
    )
    startup = re.compile(rf"gateway: HTTP http://127\.0\.0\.1:{http_port}, gRPC 127\.0\.0\.1:\d+")

    def logged() -> bool:
        gateway.check()  # a gateway that exited fails the wait at once
        return startup.search(gateway.log_file.read_text(errors="replace")) is not None

    try:
        procs.start(gateway)
        await wait_for(logged, 60, "the gateway's startup line", lambda: procs.tails(20))
    finally:
        procs.stop_all()
