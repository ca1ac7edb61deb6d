"""Plaza processes for fault tests: real OS subprocesses, logs in files, kill -9 for real.

Each is ``python -m plaza.cli.main worker|gateway`` with the deployment's environment
(``Deployment.env``); it dies with the test process (``PR_SET_PDEATHSIG``), so an aborted
run leaves none behind. Readiness is a condition: the worker's heartbeat in the model's
registry, the partitions it logs as assigned, the gateway's ``/v2/health/live``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx
import redis.asyncio

from plaza.naming import Names
from plaza.stack.local_services import free_port
from tests.faults.harness import MODEL, REPO_ROOT, Deployment, wait_for

_PR_SET_PDEATHSIG = 1
try:
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_test() -> None:
    """``preexec_fn``: the kernel SIGKILLs the child if the test process dies first."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


class PlazaProcess:
    """``python -m plaza.cli.main <argv>`` as a child process, output appended to a log."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path):
        self.name = name
        self.argv = [sys.executable, "-m", "plaza.cli.main", *argv]
        self.env = dict(env)
        self.log_file = log
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> PlazaProcess:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=REPO_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_test,
            )
        return self

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_alive(self) -> None:
        """Raise (with the log's tail) if the process has exited."""
        if self.popen is not None and self.popen.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.popen.returncode}\n{self.tail()}")

    def kill9(self) -> None:
        """SIGKILL: a crash, no drain, no commit, no goodbye to the consumer group."""
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (graceful drain), SIGKILL after ``timeout``; the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        return self.popen.returncode

    def log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def log_problems(self) -> int:
        """WARNING and ERROR lines in its log: evidence that it noticed the fault."""
        return sum(
            1 for line in self.log_text().splitlines() if " WARNING " in line or " ERROR " in line
        )

    def tail(self, lines: int = 40) -> str:
        text = "\n".join(self.log_text().splitlines()[-lines:])
        return f"--- {self.log_file} (last {lines} lines)\n{text}"


_ASSIGNED = re.compile(r": assigned \[(.*)\]$")
_REVOKED = re.compile(r": revoked \d+ partitions")
_PARTITION = re.compile(r":(\d+)'")


class WorkerProcess(PlazaProcess):
    """``plaza worker --worker.model M`` with a worker id chosen here (to find it in Redis)."""

    def __init__(self, deployment: Deployment, worker_id: str, log: Path, model: str = MODEL):
        env = deployment.env(PLAZA_WORKER__WORKER_ID=worker_id)
        super().__init__(worker_id, ["worker", "--worker.model", model], env, log)
        self.worker_id = worker_id
        self.model = model

    def assignment(self) -> set[int] | None:
        """Partitions this worker owns now, from its log; None while it is rebalancing."""
        current: set[int] | None = None
        for line in self.log_text().splitlines():
            if match := _ASSIGNED.search(line):
                current = {int(p) for p in _PARTITION.findall(match.group(1))}
            elif _REVOKED.search(line):
                current = None
        return current

    async def wait_registered(
        self, redis: redis.asyncio.Redis, names: Names, limit_s: float = 60.0
    ) -> None:
        """Until its heartbeat is in the model's registry (it is consuming by then)."""
        key = names.worker_registry_key(self.model)

        async def registered() -> bool:
            self.check_alive()
            score = await redis.zscore(key, self.worker_id)
            return score is not None and score > time.time()

        await wait_for(registered, limit_s, f"{self.worker_id} in {key}", self.tail)


async def wait_assignment(
    workers: Sequence[WorkerProcess], partitions: int, limit_s: float = 60.0
) -> None:
    """Until the workers own every partition between them, each some, none twice."""

    def settled() -> bool:
        owned = []
        for w in workers:
            w.check_alive()
            got = w.assignment()
            if not got:
                return False
            owned.append(got)
        every = [p for got in owned for p in got]
        return sorted(every) == list(range(partitions))

    await wait_for(
        settled,
        limit_s,
        "a settled partition assignment",
        lambda: "\n".join(w.tail(10) for w in workers),
    )


class GatewayProcess(PlazaProcess):
    """``plaza gateway --gateway.http_port N`` on 127.0.0.1."""

    def __init__(self, deployment: Deployment, port: int, log: Path, name: str = "gateway"):
        env = deployment.env(
            PLAZA_GATEWAY__HOST="127.0.0.1",
            # Not the defaults (8001, 8002): other tests and `make up` may hold those.
            PLAZA_GATEWAY__GRPC_PORT=str(free_port()),
            PLAZA_GATEWAY__METRICS_PORT=str(free_port()),
        )
        super().__init__(name, ["gateway", "--gateway.http_port", str(port)], env, log)
        self.url = f"http://127.0.0.1:{port}"

    async def wait_live(self, http: httpx.AsyncClient, limit_s: float = 60.0) -> None:
        async def live() -> bool:
            self.check_alive()
            try:
                response = await http.get(f"{self.url}/v2/health/live", timeout=2.0)
            except httpx.TransportError:
                return False
            return response.status_code == 200

        await wait_for(live, limit_s, f"{self.name} live at {self.url}", self.tail)


class Processes:
    """Plaza subprocesses of one test; whatever is still running is stopped afterwards."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[PlazaProcess] = []

    def worker(self, deployment: Deployment, name: str) -> WorkerProcess:
        proc = WorkerProcess(
            deployment, f"{deployment.prefix}-{name}", self.log_dir / f"{name}.log"
        )
        self.started.append(proc.start())
        return proc

    def gateway(self, deployment: Deployment, port: int, name: str = "gateway") -> GatewayProcess:
        proc = GatewayProcess(deployment, port, self.log_dir / f"{name}.log", name)
        self.started.append(proc.start())
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop(timeout=15)
