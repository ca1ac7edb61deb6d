"""The fault tests' harness: Plaza as real OS processes, a paced load, and a final audit.

- :class:`Deployment`: one test's Kafka, Redis and prefixes, as SDK settings and as the
  environment a ``plaza worker`` / ``plaza gateway`` subprocess is started with.
- :class:`PlazaProcess`: a subprocess with its log in a file; ``kill9`` is a real SIGKILL.
- :class:`Load`: publishes identity requests in paced chunks with ``publish_many``; a chunk
  Kafka did not acknowledge is sent again with the same correlation ids (a client's retry).
- :class:`ResultTail`: follows a result stream and notes when each answer first arrived
  (how recovery time is measured).
- :func:`audit`: counts answers per correlation id from the result keys and the result
  stream at the end: answered, duplicates, wrong.

Every wait is a bounded loop on a condition; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis.asyncio
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition
from redis.exceptions import RedisError

from plaza.client import PlazaClient, make_request
from plaza.codec import decode_result, decode_results
from plaza.contract import InferRequest, InferResult
from plaza.naming import STREAM_FIELD_RESULTS, Names
from plaza.settings import KafkaSettings, PlazaSettings, RedisSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = REPO_ROOT / "model_repository"
MODEL = "identity"
POLL_S = 0.02
"""Poll interval inside the bounded wait loops."""


async def wait_for(
    predicate: Callable[[], Awaitable[bool] | bool],
    timeout: float,
    what: str,
    detail: Callable[[], str] | None = None,
) -> float:
    """Poll ``predicate`` until true; returns the seconds it took, fails after ``timeout``."""
    start = time.monotonic()
    while True:
        value = predicate()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            extra = f"\n{detail()}" if detail else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        await asyncio.sleep(POLL_S)


# -- the deployment under test --------------------------------------------------------------


@dataclass(frozen=True)
class Deployment:
    """Where one test's Plaza runs: its Kafka, its Redis, its own topic and key prefixes."""

    bootstrap: str
    redis_url: str
    prefix: str
    partitions: int = 4
    replication_factor: int = 1
    min_insync_replicas: int | None = None

    @property
    def names(self) -> Names:
        return Names(topic_prefix=f"{self.prefix}.", key_prefix=f"{self.prefix}:")

    @property
    def topic(self) -> str:
        return self.names.request_topic(MODEL)

    @property
    def group(self) -> str:
        return self.names.consumer_group(MODEL)

    def settings(self) -> PlazaSettings:
        """Settings for the SDK in the test process (the same deployment as the env)."""
        return PlazaSettings(
            repository=REPOSITORY,
            kafka=KafkaSettings(
                bootstrap_servers=self.bootstrap,
                topic_prefix=self.names.topic_prefix,
                partitions=self.partitions,
                replication_factor=self.replication_factor,
                min_insync_replicas=self.min_insync_replicas,
            ),
            redis=RedisSettings(
                url=self.redis_url, key_prefix=self.names.key_prefix, stream_maxlen=100_000
            ),
        )

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a Plaza subprocess: ours only (inherited PLAZA_* dropped)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLAZA_")}
        env.update(
            PLAZA_KAFKA__BOOTSTRAP_SERVERS=self.bootstrap,
            PLAZA_KAFKA__TOPIC_PREFIX=self.names.topic_prefix,
            PLAZA_KAFKA__PARTITIONS=str(self.partitions),
            PLAZA_KAFKA__REPLICATION_FACTOR=str(self.replication_factor),
            PLAZA_REDIS__URL=self.redis_url,
            PLAZA_REDIS__KEY_PREFIX=self.names.key_prefix,
            PLAZA_REDIS__STREAM_MAXLEN="100000",
            PLAZA_REPOSITORY=str(REPOSITORY),
            PLAZA_WORKER__INTRA_OP_THREADS="1",
            PLAZA_WORKER__HEARTBEAT_INTERVAL_S="0.5",
            PLAZA_WORKER__DEVICE="cpu",
            PYTHONUNBUFFERED="1",
        )
        if self.min_insync_replicas is not None:
            env["PLAZA_KAFKA__MIN_INSYNC_REPLICAS"] = str(self.min_insync_replicas)
        env.update(extra)
        return env


# -- processes ------------------------------------------------------------------------------

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
    """``python -m plaza_cli.main <argv>`` as a child process, output appended to a log."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path):
        self.name = name
        self.argv = [sys.executable, "-m", "plaza_cli.main", *argv]
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
            raise AssertionError(
                f"{self.name} exited with {self.popen.returncode}\n{self.tail()}"
            )

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

    async def wait_registered(self, redis: redis.asyncio.Redis, names: Names,
                              timeout: float = 60.0) -> None:
        """Until its heartbeat is in the model's registry (it is consuming by then)."""
        key = names.worker_registry_key(self.model)

        async def registered() -> bool:
            self.check_alive()
            score = await redis.zscore(key, self.worker_id)
            return score is not None and score > time.time()

        await wait_for(registered, timeout, f"{self.worker_id} in {key}", self.tail)


async def wait_assignment(workers: Sequence[WorkerProcess], partitions: int,
                          timeout: float = 60.0) -> None:
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

    await wait_for(settled, timeout, "a settled partition assignment",
                   lambda: "\n".join(w.tail(10) for w in workers))


class GatewayProcess(PlazaProcess):
    """``plaza gateway --gateway.http_port N`` on 127.0.0.1."""

    def __init__(self, deployment: Deployment, port: int, log: Path, name: str = "gateway"):
        env = deployment.env(PLAZA_GATEWAY__HOST="127.0.0.1")
        super().__init__(name, ["gateway", "--gateway.http_port", str(port)], env, log)
        self.url = f"http://127.0.0.1:{port}"

    async def wait_live(self, http: httpx.AsyncClient, timeout: float = 60.0) -> None:
        async def live() -> bool:
            self.check_alive()
            try:
                response = await http.get(f"{self.url}/v2/health/live", timeout=2.0)
            except httpx.TransportError:
                return False
            return response.status_code == 200

        await wait_for(live, timeout, f"{self.name} live at {self.url}", self.tail)


class Processes:
    """Plaza subprocesses of one test; whatever is still running is stopped afterwards."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[PlazaProcess] = []

    def worker(self, deployment: Deployment, name: str) -> WorkerProcess:
        proc = WorkerProcess(deployment, f"{deployment.prefix}-{name}", self.log_dir / f"{name}.log")
        self.started.append(proc.start())
        return proc

    def gateway(self, deployment: Deployment, port: int, name: str = "gateway") -> GatewayProcess:
        proc = GatewayProcess(deployment, port, self.log_dir / f"{name}.log", name)
        self.started.append(proc.start())
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop(timeout=15)


# -- the load -------------------------------------------------------------------------------


def value(i: int) -> np.ndarray[Any, Any]:
    """Request ``i``'s input (and, for identity, its expected output): distinct per i."""
    return np.array([[i, i + 0.5]], dtype=np.float32)


class Load:
    """``n`` identity requests published in chunks at ``rate`` per second, answers to ``stream``.

    A chunk that Kafka does not acknowledge (broker down, leader moving) is published again
    with the same requests and ids, as a client would retry; the idempotent result writer
    makes the resend harmless.
    """

    def __init__(self, client: PlazaClient, stream: str | None, n: int, *, rate: float,
                 chunk: int = 50, give_up_s: float = 120.0) -> None:
        self.client = client
        self.stream = stream
        self.n = n
        self.rate = rate
        self.chunk = chunk
        self.give_up_s = give_up_s
        self.expected: dict[str, np.ndarray[Any, Any]] = {}
        """Correlation id -> the answer it must get."""
        self.acked_at: dict[str, float] = {}
        """Correlation id -> when Kafka acknowledged it (monotonic)."""
        self.resent = 0
        self.errors: Counter[str] = Counter()

    def request(self, i: int) -> InferRequest:
        return make_request(MODEL, {"INPUT0": value(i)}, reply_stream=self.stream,
                            correlation_id=f"req-{i:06d}")

    @property
    def acked(self) -> int:
        return len(self.acked_at)

    async def run(self) -> None:
        start = time.monotonic()
        for first in range(0, self.n, self.chunk):
            due = start + first / self.rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))  # pacing, not syncing
            await self._publish([self.request(i) for i in range(first, min(first + self.chunk,
                                                                          self.n))])

    async def _publish(self, requests: list[InferRequest]) -> None:
        for req in requests:
            self.expected[req.id] = req.inputs[0].to_numpy()
        give_up = time.monotonic() + self.give_up_s
        while True:
            try:
                await self.client.publish_many(requests)
                break
            except Exception as exc:  # not acknowledged: resend the whole chunk
                self.errors[type(exc).__name__] += 1
                if time.monotonic() > give_up:
                    raise
                self.resent += len(requests)
                await asyncio.sleep(0.2)
        now = time.monotonic()
        for req in requests:
            self.acked_at.setdefault(req.id, now)

    def acked_before(self, t: float) -> set[str]:
        return {rid for rid, at in self.acked_at.items() if at <= t}


class ResultTail:
    """Follows a result stream from its start; notes each answer's first arrival time.

    Survives Redis restarts (reconnects and resumes after the last entry it read).
    """

    def __init__(self, redis_url: str, stream: str) -> None:
        self.stream = stream
        self._redis = redis.asyncio.Redis.from_url(
            redis_url, socket_timeout=5, socket_connect_timeout=1
        )
        self.first_seen: dict[str, float] = {}
        self.by_worker: Counter[str] = Counter()
        self.entries = 0
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    @property
    def answered(self) -> int:
        return len(self.first_seen)

    def start(self) -> ResultTail:
        self._task = asyncio.create_task(self._follow(), name=f"tail:{self.stream}")
        return self

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 10)
        await self._redis.aclose()

    async def _follow(self) -> None:
        last: bytes | str = "0-0"
        while not self._stopping:
            try:
                reply: Any = await self._redis.xread({self.stream: last}, count=500, block=200)
            except (RedisError, OSError):  # Redis down or loading its AOF: try again
                await asyncio.sleep(POLL_S)
                continue
            for _, entries in reply or ():
                for entry_id, fields in entries:
                    last = entry_id
                    self._note(fields)

    def _note(self, fields: Mapping[bytes, bytes]) -> None:
        now = time.monotonic()
        self.entries += 1
        for res in decode_results(fields[STREAM_FIELD_RESULTS]):
            self.first_seen.setdefault(res.id, now)
            self.by_worker[res.worker] += 1

    def _open_at(self, load: Load, fault_at: float) -> list[str]:
        return [rid for rid in load.acked_before(fault_at)
                if self.first_seen.get(rid, float("inf")) > fault_at]

    def open_at(self, load: Load, fault_at: float) -> int:
        """Requests acknowledged by Kafka before the fault but answered only after it."""
        return len(self._open_at(load, fault_at))

    def recovery_s(self, load: Load, fault_at: float) -> float:
        """Seconds from the fault until every request acknowledged before it was answered."""
        waiting = self._open_at(load, fault_at)
        if not waiting:
            return 0.0
        return max(self.first_seen[rid] for rid in waiting) - fault_at


# -- draining and counting ------------------------------------------------------------------


async def committed_lag(deployment: Deployment) -> int:
    """Records of the request topic that the worker group has not committed yet."""
    tps = [TopicPartition(deployment.topic, p) for p in range(deployment.partitions)]
    admin = AIOKafkaAdminClient(bootstrap_servers=deployment.bootstrap, request_timeout_ms=5000)
    consumer = AIOKafkaConsumer(bootstrap_servers=deployment.bootstrap, group_id=None,
                                request_timeout_ms=5000)
    try:
        await admin.start()
        await consumer.start()
        committed = await admin.list_consumer_group_offsets(deployment.group, partitions=tps)
        ends = await consumer.end_offsets(tps)
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        with contextlib.suppress(Exception):
            await admin.close()
    return sum(max(0, ends[tp] - max(0, committed[tp].offset if tp in committed else 0))
               for tp in tps)


async def wait_drained(deployment: Deployment, timeout: float = 60.0) -> None:
    """Until the group has committed every record: no replay (no late duplicate) can follow."""

    async def drained() -> bool:
        try:
            return await committed_lag(deployment) == 0
        except Exception:  # a coordinator moving after a broker fault: ask again
            return False

    await wait_for(drained, timeout, f"group {deployment.group} to commit everything")


@dataclass
class FaultReport:
    """What one fault test counted, per correlation id, at the end."""

    name: str
    sent: int
    answered: int
    duplicates: int
    wrong: int
    recover_s: float
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return (f"FAULT {self.name}: sent={self.sent} answered={self.answered} "
                f"duplicates={self.duplicates} wrong={self.wrong} "
                f"recover_s={self.recover_s:.1f}")

    def detail_line(self) -> str:
        return f"FAULT {self.name} details: " + " ".join(
            f"{k}={v}" for k, v in self.details.items()
        )

    def check(self) -> None:
        """Every request answered exactly once, every answer correct."""
        assert self.answered == self.sent, self.line()
        assert self.duplicates == 0, self.line()
        assert self.wrong == 0, self.line()


def correct(result: InferResult, expected: np.ndarray[Any, Any]) -> bool:
    """An ok identity answer whose OUTPUT0 equals the request's INPUT0 (shape, dtype, values)."""
    if result.error is not None:
        return False
    try:
        out = result.output("OUTPUT0").to_numpy()
    except KeyError:
        return False
    return out.dtype == expected.dtype and np.array_equal(out, expected)


async def read_result_keys(r: redis.asyncio.Redis, names: Names,
                           ids: Iterable[str]) -> dict[str, InferResult]:
    """GET every id's result key (pipelined, 1000 a round trip); missing ids are absent."""
    ids = list(ids)
    found: dict[str, InferResult] = {}
    for start in range(0, len(ids), 1000):
        part = ids[start:start + 1000]
        pipe = r.pipeline(transaction=False)
        for rid in part:
            pipe.get(names.result_key(rid))
        for rid, raw in zip(part, await pipe.execute(), strict=True):
            if raw is not None:
                found[rid] = decode_result(raw)
    return found


async def read_stream(r: redis.asyncio.Redis, stream: str) -> tuple[list[InferResult], int]:
    """Every result in ``stream`` (XRANGE, 1000 entries a page) and the number of entries."""
    results: list[InferResult] = []
    entries = 0
    start = "-"
    while True:
        page: Any = await r.xrange(stream, min=start, max="+", count=1000)
        if not page:
            return results, entries
        for entry_id, fields in page:
            entries += 1
            results.extend(decode_results(fields[STREAM_FIELD_RESULTS]))
        start = "(" + page[-1][0].decode()


async def audit(name: str, r: redis.asyncio.Redis, names: Names,
                expected: Mapping[str, np.ndarray[Any, Any]], stream: str | None,
                recover_s: float, **details: Any) -> FaultReport:
    """Count answers per correlation id: from the result keys and (if any) the result stream.

    answered: ids with an answer under their key (and, with a stream, in the stream too);
    duplicates: extra stream answers for an id, plus ids whose stream answer differs from
    their key's; wrong: answers that are errors or not equal to the input, or for ids never
    sent.
    """
    keys = await read_result_keys(r, names, expected)
    wrong = sum(1 for rid, res in keys.items() if not correct(res, expected[rid]))
    answered = set(keys)
    duplicates = 0
    if stream is not None:
        results, entries = await read_stream(r, stream)
        per_id = Counter(res.id for res in results)
        duplicates = sum(n - 1 for n in per_id.values())
        for res in results:
            if res.id not in expected:
                wrong += 1
            elif res.id in keys and _differs(res, keys[res.id]):
                duplicates += 1  # a second, different answer for the same id
        answered &= set(per_id)
        details = {"key_answers": len(keys), "stream_answers": len(per_id),
                   "stream_duplicates": sum(n - 1 for n in per_id.values()),
                   "stream_entries": entries, **details}
    return FaultReport(name, len(expected), len(answered), duplicates, wrong, recover_s,
                       details)


def _differs(a: InferResult, b: InferResult) -> bool:
    if (a.error is None) != (b.error is None) or a.worker != b.worker:
        return True
    return any(not np.array_equal(x.to_numpy(), y.to_numpy())
               for x, y in zip(a.outputs, b.outputs, strict=False))
