"""Real Kafka and Redis on this machine, without Docker.

Used by ``make up`` (``python -m plaza.cli.services up``), by ``tests/conftest.py`` and by the
fault tests (kill -9 a broker, restart Redis, a three-broker cluster):

- :class:`KafkaCluster`: Apache Kafka 4.x in KRaft mode, ``n`` combined broker+controller
  nodes on 127.0.0.1, jars fetched from Maven Central by ``deploy/kafka/pom.xml``.
- :class:`RedisServer`: Debian's ``redis-server`` with a config file written here, AOF on.

Both run as child processes of the caller, log to files in their data dir, are ready only
when they answer over their own protocol (a Kafka metadata request, a Redis PING), and die
with the thread that started them (``PR_SET_PDEATHSIG``), so a killed test run leaves no
broker behind.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import ctypes
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal, Self

import redis
import redis.asyncio
from aiokafka.admin import AIOKafkaAdminClient

__all__ = [
    "KafkaCluster",
    "RedisServer",
    "ServiceError",
    "ensure_kafka_jars",
    "ensure_redis_server",
    "free_port",
    "new_cluster_id",
    "run_services_cli",
]

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_POM = Path("deploy/kafka/pom.xml")
KAFKA_LOG4J2 = Path("deploy/kafka/log4j2.xml")
KAFKA_LIBS = Path(".cache/kafka/libs")
_LIBS_STAMP = ".complete"  # in the libs folder; the JVM's 'libs/*' classpath only takes jars


class ServiceError(RuntimeError):
    """A service could not be installed, started, reached or stopped."""


# -- installing -----------------------------------------------------------------------------


def ensure_kafka_jars(repo_root: Path | str = REPO_ROOT) -> Path:
    """Return the folder of Kafka's jars, fetching them with ``mvn`` if missing or stale.

    The folder (``.cache/kafka/libs``) carries a stamp with the pom's hash, so a changed
    pom (a new Kafka version) fetches again, and an interrupted fetch never looks complete:
    jars land in a temporary folder that is renamed into place only when mvn succeeded.
    """
    root = Path(repo_root).resolve()
    pom = root / KAFKA_POM
    libs = root / KAFKA_LIBS
    if not pom.is_file():
        raise ServiceError(f"{pom} not found: is {root} the Plaza repository?")
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    if _stamp_matches(libs, digest):
        return libs
    libs.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(libs.parent / ".fetch.lock"):
        if not _stamp_matches(libs, digest):  # another process may have fetched meanwhile
            _fetch_jars(pom, libs, digest)
    return libs


def _stamp_matches(libs: Path, digest: str) -> bool:
    stamp = libs / _LIBS_STAMP
    return stamp.is_file() and stamp.read_text().strip() == digest


def _fetch_jars(pom: Path, libs: Path, digest: str) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ServiceError("mvn not found; install Maven (apt-get install -y maven) and Java 17")
    tmp = libs.with_name(f"{libs.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies"]
    cmd += [f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not any(tmp.glob("kafka_2.13-*.jar")):
        shutil.rmtree(tmp, ignore_errors=True)
        output = (done.stdout + done.stderr)[-3000:]
        raise ServiceError(f"fetching Kafka jars failed ({' '.join(cmd)}):\n{output}")
    (tmp / _LIBS_STAMP).write_text(digest + "\n")
    shutil.rmtree(libs, ignore_errors=True)
    tmp.rename(libs)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_redis_server() -> str:
    """Return the path of ``redis-server``, installing Debian's package if it is missing."""
    found = _find_redis_server()
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None:
        raise ServiceError("redis-server not found and there is no apt-get to install it")
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in (
        ["update", "-q"],
        ["install", "-y", "-q", "--no-install-recommends", "redis-server"],
    ):
        done = subprocess.run([*prefix, apt, *args], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-3000:]
            raise ServiceError(f"apt-get {' '.join(args)} failed:\n{output}")
    found = _find_redis_server()
    if not found:
        raise ServiceError("apt-get installed redis-server but no redis-server binary was found")
    return found


def _find_redis_server() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    for candidate in ("/usr/bin/redis-server", "/usr/local/bin/redis-server"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _find_java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home, "bin", "java"), os.X_OK):
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if found is None:
        raise ServiceError(
            "java not found; Kafka 4 needs Java 17+ (apt-get install openjdk-17-jre)"
        )
    return found


# -- ports and ids --------------------------------------------------------------------------


def free_port(preferred: int | None = None, count: int = 1) -> int:
    """First port of ``count`` consecutive free TCP ports on 127.0.0.1.

    ``preferred`` when that whole block is free, else a block starting at a port the OS
    hands out. Free means bindable with SO_REUSEADDR, as the servers bind.
    """
    if preferred is not None and _ports_free(preferred, count):
        return preferred
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            start = int(sock.getsockname()[1])
        if start + count <= 65535 and _ports_free(start, count):
            return start
    raise ServiceError(f"found no block of {count} free ports on {HOST}")


def _ports_free(start: int, count: int) -> bool:
    return all(_port_free(port) for port in range(start, start + count))


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _require_free(ports: Sequence[int], what: str) -> None:
    taken = [port for port in ports if not _port_free(port)]
    if taken:
        raise ServiceError(f"{what}: port(s) {taken} on {HOST} already in use")


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (as Kafka's Uuid).

    Never one starting with '-': a command line would read it as an option."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


# -- child processes ------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
try:
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn``: the kernel SIGTERMs the child when the starting thread exits.

    So a pytest or ``up`` killed with -9 leaves no JVM or redis-server behind. The signal
    follows the *thread* that called Popen: start services from a long-lived thread.
    """

    def preexec() -> None:
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class _Process:
    """One service child process: output appended to a log file, stopped or killed by pid."""

    def __init__(self, name: str, argv: Sequence[str], log_file: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_file = log_file
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def crashed(self) -> bool:
        """Started, not stopped by us, and no longer running."""
        return self.popen is not None and self.popen.poll() is not None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.running and self.popen else None

    def start(self, cwd: Path) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches only us; we stop services in order
                preexec_fn=_die_with_parent(os.getpid()),
            )

    def terminate(self) -> None:
        """Send SIGTERM (graceful shutdown) without waiting."""
        if self.running and self.popen:
            self.popen.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> bool:
        """Wait for exit; SIGKILL after ``timeout``. True when it exited on its own."""
        if self.popen is None:
            return True
        graceful = True
        try:
            self.popen.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            graceful = False
            self.popen.kill()
            self.popen.wait()
        self.popen = None
        return graceful

    def stop(self, timeout: float) -> bool:
        self.terminate()
        return self.wait(timeout)

    def kill(self) -> None:
        if self.popen is not None:
            if self.popen.poll() is None:
                self.popen.kill()
            self.popen.wait()
            self.popen = None


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path}: no log)"
    return f"--- {path} (last {lines} lines)\n" + "\n".join(text.splitlines()[-lines:])


def _run_coroutine(factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a coroutine to completion from sync code, even inside a running event loop."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(lambda: asyncio.run(factory())).result()


# -- Kafka ----------------------------------------------------------------------------------


class KafkaCluster:
    """Apache Kafka 4.x in KRaft mode on 127.0.0.1: ``nodes`` combined broker+controller nodes.

    Node ``i`` (0-based; also its ``node.id``) serves clients on ``port + i`` and the
    controller quorum on ``controller_port + i`` (default ``port + nodes``, so one node on
    9092 gets 9093), and keeps config, data and logs in ``data_dir/node-<i>/`` (broker log:
    ``server.log``; JVM output: ``stdout.log``). Storage is formatted once per data dir (the
    cluster id is kept in ``data_dir/cluster.id``), so a restarted node keeps its data.

    Replication of internal topics and the default replication factor are ``min(3, nodes)``;
    ``config`` adds or overrides any broker property. ``fast_start`` runs the JVM with the
    client compiler only (quicker start, lower peak throughput): right for tests, not for
    benchmarks. A class-data-sharing archive is dumped on the first graceful stop and
    reused afterwards, which roughly halves the JVM's start.

    Use as a context manager (start + wait_ready, then stop) or call the methods.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        nodes: int = 1,
        port: int = 9092,
        controller_port: int | None = None,
        min_insync_replicas: int = 1,
        heap: str = "512m",
        fast_start: bool = True,
        config: Mapping[str, str | int] | None = None,
        repo_root: Path | str = REPO_ROOT,
        java: str | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError("nodes must be >= 1")
        if not 1 <= min_insync_replicas <= nodes:
            raise ValueError("min_insync_replicas must be between 1 and nodes")
        self.data_dir = Path(data_dir).resolve()
        self.nodes = nodes
        self.port = port
        self.controller_port = port + nodes if controller_port is None else controller_port
        self.min_insync_replicas = min_insync_replicas
        self.heap = heap
        self.fast_start = fast_start
        self.config = dict(config or {})
        self.repo_root = Path(repo_root).resolve()
        self._java = java
        self._libs: Path | None = None
        self._procs: dict[int, _Process] = {}
        self._cds_dump: tuple[int, Path] | None = None  # (node, temporary archive path)

    # -- addresses and state --
    @property
    def node_ids(self) -> range:
        return range(self.nodes)

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:port,..."`` for every node (clients skip the ones that are down)."""
        return ",".join(self.broker_address(node) for node in self.node_ids)

    def broker_address(self, node: int) -> str:
        return f"{HOST}:{self.port + self._check_node(node)}"

    def node_dir(self, node: int) -> Path:
        return self.data_dir / f"node-{self._check_node(node)}"

    def log_file(self, node: int) -> Path:
        return self.node_dir(node) / "server.log"

    def is_running(self, node: int) -> bool:
        proc = self._procs.get(self._check_node(node))
        return proc is not None and proc.running

    def running_nodes(self) -> list[int]:
        return [node for node in self.node_ids if self.is_running(node)]

    def pid(self, node: int) -> int | None:
        proc = self._procs.get(self._check_node(node))
        return proc.pid if proc else None

    @property
    def version(self) -> str:
        """The Kafka version of the fetched jars, e.g. ``"4.4.0"``."""
        jar = next(self._ensure_libs().glob("kafka_2.13-*.jar"))
        return jar.name.removeprefix("kafka_2.13-").removesuffix(".jar")

    # -- lifecycle --
    def start(self) -> Self:
        """Write configs, format storage where needed and start every node that is down."""
        self._prepare()
        for node in self.node_ids:
            if not self.is_running(node):
                self._launch(node)
        return self

    def start_node(self, node: int) -> None:
        """Start one node (after :meth:`kill` or :meth:`stop_node`); no-op if running."""
        self._check_node(node)
        if not self.is_running(node):
            self._prepare()
            self._launch(node)

    def stop_node(self, node: int, timeout: float = 30.0) -> None:
        """SIGTERM one node (controlled shutdown); SIGKILL if it is not gone in ``timeout``."""
        proc = self._procs.pop(self._check_node(node), None)
        if proc is not None:
            graceful = proc.stop(timeout)
            self._finish_cds_dump(node, graceful)

    def kill(self, node: int) -> None:
        """SIGKILL one node, as a crash: no controlled shutdown, no flush."""
        proc = self._procs.pop(self._check_node(node), None)
        if proc is not None:
            proc.kill()
            self._finish_cds_dump(node, graceful=False)

    def restart(self, node: int, *, hard: bool = False, timeout: float = 30.0) -> None:
        """Stop (or with ``hard``, SIGKILL) one node and start it again on the same data."""
        if hard:
            self.kill(node)
        else:
            self.stop_node(node, timeout)
        self.start_node(node)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every node: SIGTERM all at once, then SIGKILL whatever outlives ``timeout``."""
        procs, self._procs = self._procs, {}
        for proc in procs.values():
            proc.terminate()
        deadline = time.monotonic() + timeout
        for node, proc in procs.items():
            graceful = proc.wait(deadline - time.monotonic())
            self._finish_cds_dump(node, graceful)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until every running node answers metadata requests (see wait_ready_async)."""
        _run_coroutine(lambda: self.wait_ready_async(timeout))

    async def wait_ready_async(self, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Wait until every running node answers a metadata request listing all of them.

        Each node is asked itself: a broker serves requests only once the controller has
        unfenced it, so an answer proves a restarted node is really back (the others still
        list a killed node until its session times out). Raises ServiceError with the
        log's tail if a node exits or ``timeout`` passes.
        """
        expected = set(self.running_nodes())
        if not expected:
            raise ServiceError("no Kafka node is running; call start() first")
        deadline = time.monotonic() + timeout
        while True:
            self._raise_if_crashed()
            answers = await asyncio.gather(
                *(self._brokers_seen_by(node, deadline) for node in sorted(expected))
            )
            lagging = [
                n for n, seen in zip(sorted(expected), answers, strict=True) if not expected <= seen
            ]
            if not lagging:
                return
            if time.monotonic() >= deadline:
                logs = "\n".join(_tail(self.log_file(node)) for node in lagging)
                raise ServiceError(
                    f"Kafka not ready after {timeout:.0f}s: nodes {lagging} do not answer "
                    f"with all of {sorted(expected)} live\n{logs}"
                )
            await asyncio.sleep(0.1)

    def __enter__(self) -> Self:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals --
    def _check_node(self, node: int) -> int:
        if node not in self.node_ids:
            raise ValueError(f"node must be in 0..{self.nodes - 1}, got {node}")
        return node

    def _ensure_libs(self) -> Path:
        if self._libs is None:
            self._libs = ensure_kafka_jars(self.repo_root)
        return self._libs

    def _prepare(self) -> None:
        """Jars, config files and formatted storage for every node (formats only once)."""
        self._ensure_libs()
        if self._java is None:
            self._java = _find_java()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for node in self.node_ids:
            self.node_dir(node).mkdir(exist_ok=True)
            (self.node_dir(node) / "server.properties").write_text(self._properties(node))
        self._format(
            [n for n in self.node_ids if not (self._log_dir(n) / "meta.properties").exists()]
        )

    def _log_dir(self, node: int) -> Path:
        return self.node_dir(node) / "data"

    def _cluster_id(self) -> str:
        path = self.data_dir / "cluster.id"
        if not path.exists():
            path.write_text(new_cluster_id() + "\n")
        return path.read_text().strip()

    def _properties(self, node: int) -> str:
        replication = min(3, self.nodes)
        voters = ",".join(f"{n}@{HOST}:{self.controller_port + n}" for n in self.node_ids)
        props: dict[str, str | int] = {
            "process.roles": "broker,controller",
            "node.id": node,
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{HOST}:{self.port + node},"
            f"CONTROLLER://{HOST}:{self.controller_port + node}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port + node}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self._log_dir(node)),
            "auto.create.topics.enable": "false",
            "num.partitions": 1,
            "default.replication.factor": replication,
            "min.insync.replicas": self.min_insync_replicas,
            # Internal topics: replicated as far as the cluster allows, few partitions
            # (creating 50 of each on two cores is what makes a first consumer group slow).
            "offsets.topic.replication.factor": replication,
            "offsets.topic.num.partitions": 3,
            "transaction.state.log.replication.factor": replication,
            "transaction.state.log.min.isr": min(2, replication),
            "transaction.state.log.num.partitions": 3,
            "share.coordinator.state.topic.replication.factor": replication,
            "share.coordinator.state.topic.min.isr": min(2, replication),
            "share.coordinator.state.topic.num.partitions": 3,
            # Tests: join groups at once, allow short session timeouts, notice a dead broker
            # within seconds rather than the default nine.
            "group.initial.rebalance.delay.ms": 0,
            "group.min.session.timeout.ms": 1000,
            "broker.session.timeout.ms": 6000,
            "broker.heartbeat.interval.ms": 1000,
            # Records up to 10 MiB (Plaza's producer allows 8 MiB requests).
            "message.max.bytes": 10 * 1024 * 1024,
            "replica.fetch.max.bytes": 10 * 1024 * 1024,
            "log.segment.bytes": 64 * 1024 * 1024,
            "log.retention.ms": 3_600_000,
            "log.retention.check.interval.ms": 60_000,
            # Two cores: fewer threads than the defaults.
            "num.network.threads": 2,
            "num.io.threads": 4,
            "num.recovery.threads.per.data.dir": 1,
            "background.threads": 4,
        }
        props.update(self.config)
        return "".join(f"{key}={value}\n" for key, value in props.items())

    def _jvm(self, node: int, *, dump_cds: Path | None = None) -> list[str]:
        assert self._java is not None and self._libs is not None
        argv = [self._java, f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:-UsePerfData"]
        argv += ["-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true"]
        if self.fast_start:
            argv.append("-XX:TieredStopAtLevel=1")
        archive = self._cds_archive()
        if dump_cds is not None:
            argv.append(f"-XX:ArchiveClassesAtExit={dump_cds}")
        elif archive.exists():
            argv.append(f"-XX:SharedArchiveFile={archive}")
        argv += [
            f"-Dkafka.logs.dir={self.node_dir(node)}",
            f"-Dlog4j2.configurationFile={self.repo_root / KAFKA_LOG4J2}",
            "-cp",
            f"{self._libs}/*",  # expanded by the JVM, not a shell
        ]
        return argv

    def _format(self, nodes: Sequence[int]) -> None:
        """Run Kafka's StorageTool for ``nodes`` in parallel (one JVM each)."""
        if not nodes:
            return
        cluster_id = self._cluster_id()
        procs = []
        for node in nodes:
            props = self.node_dir(node) / "server.properties"
            argv = [*self._jvm(node), "kafka.tools.StorageTool", "format"]
            argv += [f"--cluster-id={cluster_id}", "-c", str(props)]
            proc = _Process(f"kafka-format-{node}", argv, self.node_dir(node) / "format.log")
            proc.start(self.node_dir(node))
            procs.append(proc)
        failed = []
        for proc in procs:
            assert proc.popen is not None
            code = proc.popen.wait()
            if code != 0:
                failed.append(_tail(proc.log_file))
            proc.popen = None
        if failed:
            raise ServiceError("formatting Kafka storage failed:\n" + "\n".join(failed))

    def _launch(self, node: int) -> None:
        _require_free([self.port + node, self.controller_port + node], f"Kafka node {node}")
        dump = None
        if self._cds_dump is None and not self._cds_archive().exists():
            dump = self._cds_archive().with_suffix(f".{os.getpid()}-{id(self)}-{node}.tmp")
            dump.parent.mkdir(parents=True, exist_ok=True)
            self._cds_dump = (node, dump)
        props = self.node_dir(node) / "server.properties"
        argv = [*self._jvm(node, dump_cds=dump), "kafka.Kafka", str(props)]
        proc = _Process(f"kafka-{node}", argv, self.node_dir(node) / "stdout.log")
        proc.start(self.node_dir(node))
        self._procs[node] = proc

    def _cds_archive(self) -> Path:
        """The class-data-sharing archive for these jars on this JVM (may not exist yet)."""
        assert self._libs is not None and self._java is not None
        key = hashlib.sha256()
        for jar in sorted(self._libs.glob("*.jar")):
            key.update(f"{jar.name}:{jar.stat().st_size};".encode())
        java = Path(self._java).resolve()
        for part in (java, java.parent.parent / "lib" / "server" / "libjvm.so"):
            with contextlib.suppress(OSError):
                stat = part.stat()
                key.update(f"{part}:{stat.st_size}:{stat.st_mtime_ns};".encode())
        return self._libs.parent / "cds" / f"kafka-{key.hexdigest()[:16]}.jsa"

    def _finish_cds_dump(self, node: int, graceful: bool) -> None:
        """Keep the archive a node dumped at a clean exit; discard a partial one."""
        if self._cds_dump is None or self._cds_dump[0] != node:
            return
        _, tmp = self._cds_dump
        self._cds_dump = None
        if graceful and tmp.exists() and tmp.stat().st_size > 0:
            os.replace(tmp, self._cds_archive())
        else:
            tmp.unlink(missing_ok=True)

    def _raise_if_crashed(self) -> None:
        for node, proc in self._procs.items():
            if proc.crashed:
                code = proc.popen.returncode if proc.popen else None
                logs = _tail(self.log_file(node)) + "\n" + _tail(proc.log_file, 10)
                raise ServiceError(f"Kafka node {node} exited with code {code}\n{logs}")

    async def _brokers_seen_by(self, node: int, deadline: float) -> set[int]:
        """Broker ids in ``node``'s own metadata answer; empty while it does not answer."""
        if not _accepts(self.port + node):
            return set()
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.broker_address(node),
            request_timeout_ms=3000,
            client_id="plaza-services-ready",
        )
        try:
            budget = max(0.5, min(5.0, deadline - time.monotonic()))
            await asyncio.wait_for(admin.start(), budget)
            cluster = await asyncio.wait_for(admin.describe_cluster(), budget)
            return {int(broker["node_id"]) for broker in cluster["brokers"]}
        except Exception:  # not ready yet: refused, timed out, no metadata
            return set()
        finally:
            with contextlib.suppress(Exception):
                await admin.close()


# -- Redis ----------------------------------------------------------------------------------


class RedisServer:
    """Debian's ``redis-server`` on 127.0.0.1 with an explicit config, AOF on, no RDB.

    Data and the log (``redis.log``) live in ``data_dir``, so :meth:`restart` (and
    :meth:`kill` then :meth:`start`) keeps what the append-only file holds. With
    ``appendfsync="always"`` every acknowledged write survives even a SIGKILL.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int = 6379,
        password: str | None = None,
        appendfsync: Literal["always", "everysec", "no"] = "everysec",
        binary: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.password = password
        self.appendfsync = appendfsync
        self._binary = binary
        self._proc: _Process | None = None

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:port/0``."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "redis.conf"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.running

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> Self:
        """Write the config and start redis-server (no-op if running)."""
        if self.running:
            return self
        if self._binary is None:
            self._binary = ensure_redis_server()
        _require_free([self.port], "Redis")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(self._config())
        self._proc = _Process(
            "redis", [self._binary, str(self.config_file)], self.data_dir / "stdout.log"
        )
        self._proc.start(self.data_dir)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (Redis fsyncs the AOF and exits); SIGKILL after ``timeout``."""
        if self._proc is not None:
            self._proc.stop(timeout)
            self._proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash: only what the AOF had fsynced survives."""
        if self._proc is not None:
            self._proc.kill()
            self._proc = None

    def restart(self, *, hard: bool = False, timeout: float = 15.0) -> None:
        """Stop (or with ``hard``, SIGKILL) and start again on the same data dir."""
        if hard:
            self.kill()
        else:
            self.stop(timeout)
        self.start()

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Block until PING succeeds (Redis answers LOADING while it replays the AOF)."""
        deadline = time.monotonic() + timeout
        client = redis.Redis(
            host=HOST, port=self.port, password=self.password,
            socket_connect_timeout=0.5, socket_timeout=2.0,
        )  # fmt: skip
        try:
            while True:
                self._raise_if_crashed()
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                if time.monotonic() >= deadline:
                    raise ServiceError(
                        f"Redis not ready after {timeout:.0f}s\n{_tail(self.log_file)}"
                    )
                time.sleep(0.05)
        finally:
            client.close()

    async def wait_ready_async(self, timeout: float = 15.0) -> None:  # noqa: ASYNC109
        """:meth:`wait_ready` without blocking the event loop."""
        await asyncio.to_thread(self.wait_ready, timeout)

    def __enter__(self) -> Self:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _config(self) -> str:
        lines = [
            f"bind {HOST}",
            f"port {self.port}",
            "protected-mode no",  # bound to loopback only; a password is optional
            "daemonize no",
            "supervised no",
            f'dir "{self.data_dir}"',
            f'logfile "{self.log_file}"',
            "loglevel notice",
            'save ""',
            "appendonly yes",
            f"appendfsync {self.appendfsync}",
            'appenddirname "appendonlydir"',
            "databases 16",
        ]
        if self.password:
            lines.append(f'requirepass "{self.password}"')
        return "\n".join(lines) + "\n"

    def _raise_if_crashed(self) -> None:
        if self._proc is not None and self._proc.crashed:
            logs = _tail(self.log_file) + "\n" + _tail(self._proc.log_file, 10)
            raise ServiceError(f"redis-server exited\n{logs}")


# -- command line ---------------------------------------------------------------------------


def run_services_cli(argv: list[str] | None = None) -> int:
    """``up``: start Kafka and Redis and keep them until Ctrl-C/SIGTERM; ``deps``: install."""
    parser = argparse.ArgumentParser(
        prog="plaza services", description="Run Plaza's Kafka and Redis on this machine."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start Kafka and Redis; stop them on Ctrl-C/SIGTERM")
    up.add_argument("--data-dir", default="var/services", help="where data and logs go")
    up.add_argument("--kafka-port", type=int, default=9092)
    up.add_argument(
        "--kafka-nodes", type=int, default=1, help="KRaft nodes (ports from --kafka-port)"
    )
    up.add_argument("--redis-port", type=int, default=6379)
    up.add_argument("--redis-password", default=None)
    up.add_argument("--fresh", action="store_true", help="delete the data dir first")
    up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    commands.add_parser("deps", help="fetch Kafka's jars and install redis-server, then exit")
    args = parser.parse_args(argv)
    try:
        if args.command == "deps":
            print(f"kafka jars: {ensure_kafka_jars()}\nredis-server: {ensure_redis_server()}")
            return 0
        return _services_up(args)
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _services_up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    if args.fresh:
        shutil.rmtree(data_dir, ignore_errors=True)
    kafka = KafkaCluster(
        data_dir / "kafka", nodes=args.kafka_nodes, port=args.kafka_port, fast_start=False
    )
    store = RedisServer(data_dir / "redis", port=args.redis_port, password=args.redis_password)
    stopping = threading.Event()
    with _stop_signals(stopping):
        try:
            store.start()
            kafka.start()
            store.wait_ready(args.timeout)
            kafka.wait_ready(args.timeout)
            nodes = f"{kafka.nodes} node{'s' if kafka.nodes > 1 else ''}"
            print(
                f"kafka  {kafka.bootstrap_servers}  (Apache Kafka {kafka.version}, KRaft, {nodes})"
            )
            print(f"redis  {store.url}  (AOF appendfsync {store.appendfsync})")
            print(f"data and logs in {data_dir}")
            print(
                f"export PLAZA_KAFKA__BOOTSTRAP_SERVERS={kafka.bootstrap_servers} "
                f"PLAZA_REDIS__URL={store.url}"
            )
            print("services up; Ctrl-C stops them", flush=True)
            return _watch(kafka, store, stopping)
        finally:
            kafka.stop()
            store.stop()
            print("services stopped", flush=True)


def _watch(kafka: KafkaCluster, store: RedisServer, stopping: threading.Event) -> int:
    """Wait for a stop signal; return 1 if a service dies first."""
    while not stopping.wait(0.5):
        down = [f"kafka node {n}" for n in kafka.node_ids if not kafka.is_running(n)]
        down += [] if store.running else ["redis"]
        if down:
            print(f"error: {', '.join(down)} exited; see the logs", file=sys.stderr)
            return 1
    return 0


@contextlib.contextmanager
def _stop_signals(stopping: threading.Event) -> Iterator[None]:
    """SIGINT/SIGTERM set ``stopping`` (main thread only) instead of raising mid-start."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


if __name__ == "__main__":
    raise SystemExit(run_services_cli())
