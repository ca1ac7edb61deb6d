"""Apache Kafka 4.x in KRaft mode on this machine, one node or a cluster, without Docker.

Jars come from Maven Central through ``deploy/kafka/pom.xml`` (:mod:`plaza.stack.install`);
each node is a :class:`~plaza.stack.process.ChildProcess` (a JVM), ready only once it
answers a metadata request itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Self

from aiokafka.admin import AIOKafkaAdminClient

from plaza.stack.data_dir import prepare_data_dir
from plaza.stack.errors import ServiceError
from plaza.stack.install import KAFKA_LOG4J2, REPO_ROOT, ensure_kafka_jars, find_java
from plaza.stack.managed import READY_TIMEOUT_S, ManagedService
from plaza.stack.ports import HOST, accepts, require_free
from plaza.stack.process import ChildProcess, tail_file
from plaza.stack.waiting import wait_for


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (as Kafka's Uuid).

    Never one starting with '-': a command line would read it as an option."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


class KafkaCluster(ManagedService):
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

    OWN_ENTRIES: ClassVar[tuple[str, ...]] = (r"cluster\.id", r"node-\d+")
    """What a cluster's data dir holds (full-match patterns): its id and one folder a node."""

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
        self._procs: dict[int, ChildProcess] = {}
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
        return proc is not None and proc.alive

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

    async def wait_ready_async(self, timeout: float = READY_TIMEOUT_S) -> None:  # noqa: ASYNC109
        """Wait until every running node answers a metadata request listing all of them.

        Each node is asked itself: a broker serves requests only once the controller has
        unfenced it, so an answer proves a restarted node is really back (the others still
        list a killed node until its session times out). Raises ServiceError with the
        log's tail if a node exits or ``timeout`` passes.
        """
        expected = sorted(self.running_nodes())
        if not expected:
            raise ServiceError("no Kafka node is running; call start() first")
        deadline = time.monotonic() + timeout
        lagging = list(expected)

        async def all_see_all() -> bool:
            self.check()
            answers = await asyncio.gather(
                *(self._brokers_seen_by(node, deadline) for node in lagging)
            )
            lagging[:] = [
                n
                for n, seen in zip(list(lagging), answers, strict=True)
                if not set(expected) <= seen
            ]
            return not lagging

        await wait_for(
            all_see_all,
            timeout,
            f"Kafka nodes {expected} to answer with all of them live (read "
            f"{', '.join(str(self.log_file(n)) for n in lagging)})",
            lambda: "\n".join(self._tail(node) for node in lagging),
            poll_s=0.1,
        )

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
            self._java = find_java()
        prepare_data_dir(self.data_dir, "Kafka data dir")
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
            log = self.node_dir(node) / "format.log"
            procs.append(ChildProcess(f"kafka-format-{node}", argv, log, cwd=self.node_dir(node)))
        for proc in procs:
            proc.start()
        failed = [proc.tail() for proc in procs if proc.wait_exit() != 0]
        if failed:
            raise ServiceError("formatting Kafka storage failed:\n" + "\n".join(failed))

    def _launch(self, node: int) -> None:
        require_free([self.port + node, self.controller_port + node], f"Kafka node {node}")
        dump = None
        if self._cds_dump is None and not self._cds_archive().exists():
            dump = self._cds_archive().with_suffix(f".{os.getpid()}-{id(self)}-{node}.tmp")
            dump.parent.mkdir(parents=True, exist_ok=True)
            self._cds_dump = (node, dump)
        props = self.node_dir(node) / "server.properties"
        argv = [*self._jvm(node, dump_cds=dump), "kafka.Kafka", str(props)]
        log = self.node_dir(node) / "stdout.log"
        proc = ChildProcess(f"kafka-{node}", argv, log, cwd=self.node_dir(node))
        self._procs[node] = proc.start()

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

    def check(self) -> None:
        """:class:`ServiceError` with the exit code and log tail of a node that exited unasked."""
        for node, proc in self._procs.items():
            if proc.crashed:
                raise ServiceError(
                    f"Kafka node {node} exited with code {proc.exit_code}\n{self._tail(node)}"
                )

    def _tail(self, node: int) -> str:
        """The broker log's tail and the JVM output's (where a failed start shows)."""
        proc = self._procs.get(node)
        broker = tail_file(self.log_file(node))
        return broker + ("\n" + proc.tail(10) if proc is not None else "")

    async def _brokers_seen_by(self, node: int, deadline: float) -> set[int]:
        """Broker ids in ``node``'s own metadata answer; empty while it does not answer."""
        if not accepts(self.port + node):
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
