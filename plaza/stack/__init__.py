"""Running Plaza's parts on this machine: Kafka, Redis, hosts and gateways as processes.

One process class (:class:`ChildProcess`: parent-death signal, log file, SIGTERM then
SIGKILL by pid) and one deployment description (:class:`Deployment`: addresses, prefixes,
topic layout, the subprocess environment). ``plaza up``, ``plaza services``, loadgen's
benchmarks and the tests are thin callers of it.

Layering: imports only the core ``plaza.*`` modules (and aiokafka, redis). Workers and
gateways are started as ``python -m plaza.cli.main worker|gateway`` subprocesses, never
imported.
"""

from plaza.stack.deployment import Deployment, new_prefix
from plaza.stack.errors import Interrupted, ServiceError, ServiceOptionError, WaitTimeout
from plaza.stack.install import ensure_kafka_jars, ensure_redis_server, find_java
from plaza.stack.kafka_cluster import KafkaCluster, new_cluster_id
from plaza.stack.members import (
    GatewayProcess,
    HostProcess,
    WorkerProcess,
    http_ok,
    http_url,
    wait_assignment,
    wait_http_ok,
    wait_http_ready,
    wait_workers,
)
from plaza.stack.ports import HOST, free_port
from plaza.stack.process import ChildProcess, ProcessGroup
from plaza.stack.redis_cluster import RedisClusterNodes
from plaza.stack.redis_server import RedisServer
from plaza.stack.services import Services
from plaza.stack.waiting import until_stopped, wait_for

__all__ = [
    "HOST",
    "ChildProcess",
    "Deployment",
    "GatewayProcess",
    "HostProcess",
    "Interrupted",
    "KafkaCluster",
    "ProcessGroup",
    "RedisClusterNodes",
    "RedisServer",
    "ServiceError",
    "ServiceOptionError",
    "Services",
    "WaitTimeout",
    "WorkerProcess",
    "ensure_kafka_jars",
    "ensure_redis_server",
    "find_java",
    "free_port",
    "http_ok",
    "http_url",
    "new_cluster_id",
    "new_prefix",
    "until_stopped",
    "wait_assignment",
    "wait_for",
    "wait_http_ok",
    "wait_http_ready",
    "wait_workers",
]
