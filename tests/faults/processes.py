"""Plaza processes of one fault test: ``plaza.stack`` workers and gateways, named here.

Each is ``python -m plaza.cli.main worker|gateway`` with the deployment's environment; it
dies with the test process (a parent-death signal), so an aborted run leaves none behind.
"""

from __future__ import annotations

from plaza.stack import ChildProcess, Deployment, GatewayProcess, ProcessGroup, WorkerProcess
from tests.faults.harness import MODEL

WORKER_ENV = {"PLAZA_WORKER__INTRA_OP_THREADS": "1", "PLAZA_WORKER__DEVICE": "cpu"}
"""Two shared cores: one compute thread per worker, and never a GPU probe."""


class FaultProcesses(ProcessGroup):
    """The test's workers (of the identity model unless named) and gateways; all stopped
    afterwards."""

    def worker(self, deployment: Deployment, name: str, model: str = MODEL) -> WorkerProcess:
        """Start worker ``name`` (of ``model``); its worker id is ``<prefix>-<name>``."""
        worker_id = f"{deployment.prefix}-{name}"
        proc = WorkerProcess(
            deployment, model, self.log_dir, name=name, worker_id=worker_id, env=WORKER_ENV
        )
        return self.start(proc)

    def gateway(self, deployment: Deployment, port: int, name: str = "gateway") -> GatewayProcess:
        """Start a gateway on 127.0.0.1:``port``."""
        return self.start(GatewayProcess(deployment, port, self.log_dir, name=name))


def log_problems(proc: ChildProcess) -> int:
    """WARNING and ERROR lines in its log: evidence that it noticed the fault."""
    lines = proc.log_text().splitlines()
    return sum(1 for line in lines if " WARNING " in line or " ERROR " in line)
