"""A Redis Cluster of Debian's ``redis-server`` processes on this machine (masters only).

Redis Cluster needs no extra tool to form: each node starts with ``cluster-enabled yes``,
owns a range of the 16384 hash slots (``CLUSTER ADDSLOTSRANGE``) and is introduced to the
others (``CLUSTER MEET``); the cluster is ready once every node reports
``cluster_state:ok``. That is what ``redis-cli --cluster create`` does, done here with
redis-py so that ``redis-cli`` need not be installed. No replicas: this cluster is for
testing that Plaza's keys and scripts respect hash slots, not for failover.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Self

import redis.asyncio
import redis.exceptions

from plaza.stack.errors import ServiceError
from plaza.stack.install import ensure_redis_server
from plaza.stack.managed import ManagedService
from plaza.stack.ports import HOST, require_free
from plaza.stack.process import ChildProcess, tail_file
from plaza.stack.waiting import wait_for

SLOTS = 16384
"""Hash slots of every Redis Cluster."""
CLUSTER_READY_TIMEOUT_S = 30.0


class RedisClusterNodes(ManagedService):
    """``nodes`` redis-server masters in cluster mode on 127.0.0.1, slots split evenly.

    Node ``i`` listens on ``port + i`` and gossips on its cluster bus port
    ``port + nodes + i``, so the block ``port .. port + 2 * nodes - 1`` must be free.
    Each node's data, ``nodes.conf`` and log live in ``data_dir/node-<i>``. Use as a
    context manager (start, form the cluster, wait for ``cluster_state:ok``; then stop).
    """

    def __init__(
        self, data_dir: Path | str, *, port: int, nodes: int = 3, binary: str | None = None
    ) -> None:
        if nodes < 1:
            raise ServiceError("a Redis Cluster needs at least one node")
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.nodes = nodes
        self._binary = binary
        self._procs: list[ChildProcess] = []

    @property
    def ports(self) -> list[int]:
        """Client ports, one per node."""
        return [self.port + i for i in range(self.nodes)]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<first port>/0``: any one node is enough to find them all."""
        return f"redis://{HOST}:{self.port}/0"

    def node_dir(self, index: int) -> Path:
        return self.data_dir / f"node-{index}"

    def slot_range(self, index: int) -> tuple[int, int]:
        """The first and last hash slot node ``index`` owns."""
        size = SLOTS // self.nodes
        first = index * size
        last = SLOTS - 1 if index == self.nodes - 1 else first + size - 1
        return first, last

    def start(self) -> Self:
        """Write each node's config and start the nodes not running."""
        if self._procs and all(p.alive for p in self._procs):
            return self
        if self._binary is None:
            self._binary = ensure_redis_server()
        self.stop()
        require_free(list(range(self.port, self.port + 2 * self.nodes)), "Redis Cluster")
        for i in range(self.nodes):
            folder = self.node_dir(i)
            folder.mkdir(parents=True, exist_ok=True)
            config = folder / "redis.conf"
            config.write_text(self._config(i))
            proc = ChildProcess(f"redis-{i}", [self._binary, str(config)], folder / "stdout.log")
            self._procs.append(proc.start())
        return self

    def stop(self, timeout: float = 15.0) -> None:
        for proc in self._procs:
            proc.stop(timeout)
        self._procs = []

    async def wait_ready_async(self, timeout: float = CLUSTER_READY_TIMEOUT_S) -> None:  # noqa: ASYNC109
        """Wait for every node, form the cluster if it is not formed, wait for state ok."""
        clients = [
            redis.asyncio.Redis(host=HOST, port=p, socket_connect_timeout=0.5, socket_timeout=5)
            for p in self.ports
        ]
        try:
            for client in clients:
                await wait_for(
                    functools.partial(self._answers, client),
                    timeout,
                    "a Redis Cluster node",
                    self._tail,
                )
            await self._form(clients)
            for client in clients:
                await wait_for(
                    functools.partial(self._state_ok, client),
                    timeout,
                    "cluster_state:ok on every Redis Cluster node",
                    self._tail,
                    poll_s=0.05,
                )
        finally:
            for client in clients:
                await client.aclose()

    async def _form(self, clients: list[redis.asyncio.Redis]) -> None:
        """Give each node its slot range (once) and make node 0 meet the others.

        Each node also gets its own config epoch, as ``redis-cli --cluster create`` does,
        so that the nodes need not resolve an epoch collision before agreeing."""
        for i, client in enumerate(clients):
            info = await client.cluster("INFO")
            if int(_info_field(info, "cluster_slots_assigned") or 0) == 0:
                first, last = self.slot_range(i)
                await client.cluster("ADDSLOTSRANGE", first, last)
                with contextlib.suppress(redis.exceptions.ResponseError):  # set once only
                    await client.cluster("SET-CONFIG-EPOCH", i + 1)
        for i, port in enumerate(self.ports[1:], start=1):
            # The bus port is not client port + 10000 here: name it (Redis 7's third argument).
            await clients[0].cluster("MEET", HOST, port, self._bus_port(i))

    def _bus_port(self, index: int) -> int:
        return self.port + self.nodes + index

    async def _answers(self, client: redis.asyncio.Redis) -> bool:
        self._raise_if_crashed()
        try:
            return bool(await client.ping())
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return False

    async def _state_ok(self, client: redis.asyncio.Redis) -> bool:
        self._raise_if_crashed()
        info = await client.cluster("INFO")
        known = int(_info_field(info, "cluster_known_nodes") or 0)
        return _info_field(info, "cluster_state") == "ok" and known == self.nodes

    def _config(self, index: int) -> str:
        folder = self.node_dir(index)
        lines = [
            f"bind {HOST}",
            f"port {self.port + index}",
            f"cluster-port {self._bus_port(index)}",
            "cluster-enabled yes",
            f'cluster-config-file "{folder / "nodes.conf"}"',
            "cluster-node-timeout 5000",
            "protected-mode no",  # loopback only
            "daemonize no",
            f'dir "{folder}"',
            f'logfile "{folder / "redis.log"}"',
            'save ""',
            "appendonly no",
        ]
        return "\n".join(lines) + "\n"

    def _tail(self) -> str:
        return "\n".join(
            f"node {i}:\n{tail_file(self.node_dir(i) / 'redis.log', 8)}" for i in range(self.nodes)
        )

    def _raise_if_crashed(self) -> None:
        for i, proc in enumerate(self._procs):
            if proc.crashed:
                raise ServiceError(f"redis-server cluster node {i} exited\n{self._tail()}")


def _info_field(info: object, name: str) -> str | None:
    """One field of CLUSTER INFO, whether redis-py parsed it into a dict or left it text."""
    if isinstance(info, dict):
        value = info.get(name)
        return None if value is None else str(value)
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    return None
