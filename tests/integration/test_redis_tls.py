"""Plaza on a Redis that speaks only TLS (``rediss://`` and ``redis.ssl_ca_certs``): the
lean channel (``plaza.resp_channel``) that the worker writes its answers with and the
gateway reads replies with, and a whole request over HTTP, Kafka, a worker and back.

The server is Debian's redis-server with its TLS port only (``port 0``), certificates made
by the openssl CLI for this module (``tests/pki.py``).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis.asyncio

from plaza.connections import redis_client
from plaza.resp_channel import channel_for
from plaza.settings import PlazaSettings, RedisSettings
from plaza.stack import ensure_redis_server, free_port
from tests.pki import Pki, make_pki
from tests.support import gateway_fronts, make_settings, running_worker, wait_for


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Pki]]:
    """(its ``rediss://`` URL, the certificates) of a TLS-only redis-server."""
    root = tmp_path_factory.mktemp("redis-tls")
    pki = make_pki(root)
    port = free_port()
    argv = [
        ensure_redis_server(), "--bind", "127.0.0.1", "--port", "0", "--tls-port", str(port),
        "--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key),
        "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "no",
        "--save", "", "--appendonly", "no", "--dir", str(root),
    ]  # fmt: skip
    with (root / "redis.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"rediss://127.0.0.1:{port}/0", pki
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.fixture
async def tls_client(tls_redis: tuple[str, Pki]) -> AsyncIterator[redis.asyncio.Redis]:
    url, pki = tls_redis
    client = redis_client(RedisSettings(url=url, ssl_ca_certs=pki.ca))

    async def answers() -> bool:
        try:
            return bool(await client.ping())
        except redis.exceptions.ConnectionError:
            return False

    await wait_for(answers, 20, "the TLS Redis to answer PING")
    try:
        yield client
    finally:
        await client.aclose()


async def test_the_lean_channel_runs_commands_and_scripts_over_tls(
    tls_client: redis.asyncio.Redis, unique_id: str
) -> None:
    ch = channel_for(tls_client)
    assert ch is not None
    key = f"{unique_id}:n"
    try:
        counts = await asyncio.gather(*(ch.call("INCR", key) for _ in range(50)))
        script = tls_client.register_script("return redis.call('GET', KEYS[1]) + ARGV[1]")
        total = await ch.evalsha(script, [key], [7])  # NOSCRIPT first: sent whole
    finally:
        await ch.close()
        await tls_client.delete(key)
    assert counts == list(range(1, 51))
    assert total == 57


async def test_a_request_is_answered_through_a_tls_redis(
    tls_redis: tuple[str, Pki],
    tls_client: redis.asyncio.Redis,
    kafka_bootstrap: str,
    unique_id: str,
    make_repository: Callable[..., Path],
) -> None:
    url, pki = tls_redis
    settings: PlazaSettings = make_settings(
        kafka_bootstrap,
        url,
        unique_id,
        repository=make_repository("identity"),
        redis={"ssl_ca_certs": pki.ca},
    )
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 8], "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }
    async with (
        running_worker(settings, "identity"),
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False) as http,
    ):
        answer = await http.post("/v2/models/identity/infer", json=body, timeout=60)
        ready = await http.get("/v2/health/ready")
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == x.ravel().tolist()
    assert ready.status_code == 200, ready.text
