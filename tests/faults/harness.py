"""The fault suite's common ground: one test's deployment, its names, request values.

The rest of the suite, one concept a module:

- ``processes``: ``plaza worker`` / ``plaza gateway`` of a test (``plaza.stack``'s
  ``WorkerProcess`` and ``GatewayProcess``: real OS subprocesses, ``kill()`` is a real
  SIGKILL), logs in the test's tmp dir;
- ``traffic``: a paced load published with ``publish_many`` (a chunk Kafka did not take is
  sent again with the same ids), and a tail of the result stream that notes when each
  answer first arrived;
- ``audit``: waiting until the worker group committed everything, then counting answers
  per correlation id from the result keys and the result stream;
- ``under_load``: the script most tests share (load, fault, wait for every answer, audit).

Every wait is ``plaza.stack.wait_for``, a bounded loop on a condition; nothing sleeps to
synchronise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from plaza.stack import Deployment

REPO_ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = REPO_ROOT / "model_repository"
MODEL = "identity"
STREAM_MAXLEN = 100_000
"""Reply streams hold every answer of a test (the audit reads them all back)."""


def fault_deployment(
    bootstrap: str, redis_url: str, prefix: str, repository: Path = REPOSITORY, **options: Any
) -> Deployment:
    """A test's Plaza (on the sample repository unless told); ``options`` go to
    :class:`Deployment`."""
    return Deployment(
        bootstrap, redis_url, repository, prefix, stream_maxlen=STREAM_MAXLEN, **options
    )


def request_topic(deployment: Deployment) -> str:
    """The topic the test's requests go to."""
    return deployment.names.request_topic(MODEL)


def worker_group(deployment: Deployment) -> str:
    """The consumer group of the test's workers."""
    return deployment.names.consumer_group(MODEL)


def value(i: int) -> np.ndarray[Any, Any]:
    """Request ``i``'s input (and, for identity, its expected output): distinct per i."""
    return np.array([[i, i + 0.5]], dtype=np.float32)
