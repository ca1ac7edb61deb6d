"""The HTTP gateway end to end: its HTTP server on a free port -> Kafka -> a real worker -> Redis.

Every test serves its own gateway with its own topic and key prefix, over a repository that
holds only the models the test uses (readiness wants a live worker for each loaded model).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np
import orjson

from plaza.settings import PlazaSettings
from tests.support import gateway_fronts, running_worker, wait_for

HEADER = "Inference-Header-Content-Length"


# -- fixtures -------------------------------------------------------------------------------


@asynccontextmanager
async def serving(settings: PlazaSettings) -> AsyncIterator[str]:
    """The gateway (``plaza.gateway.main.serving``) on a free 127.0.0.1 port; its base URL."""
    async with gateway_fronts(settings) as running:
        yield running.http_url


@asynccontextmanager
async def http(settings: PlazaSettings) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving(settings) as url,
        httpx.AsyncClient(base_url=url, trust_env=False, timeout=60) as client,
    ):
        yield client


# -- bodies ---------------------------------------------------------------------------------


def add_sub_json(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], **extra: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": list(a.shape), "data": a.tolist()},
            {
                "name": "INPUT1",
                "datatype": "INT32",
                "shape": list(b.shape),
                "data": b.reshape(-1).tolist(),
            },
        ],
        **extra,
    }


def outputs_by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["name"]: o for o in doc["outputs"]}


def identity_binary(x: np.ndarray[Any, Any], **extra: Any) -> tuple[bytes, dict[str, str]]:
    doc = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": list(x.shape),
                "parameters": {"binary_data_size": x.nbytes},
            }
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        **extra,
    }
    header = orjson.dumps(doc)
    return header + x.tobytes(), {HEADER: str(len(header))}


def split_binary(response: httpx.Response) -> tuple[dict[str, Any], bytes]:
    length = int(response.headers[HEADER])
    return orjson.loads(response.content[:length]), response.content[length:]


async def poll_until(client: httpx.AsyncClient, job_id: str, state: str) -> dict[str, Any]:
    last: dict[str, Any] = {}

    async def reached() -> bool:
        nonlocal last
        response = await client.get(f"/v2/jobs/{job_id}")
        assert response.status_code == 200, response.text
        last = response.json()
        return bool(last["status"] == state)

    await wait_for(reached, 60, f"job {job_id} to be {state}")
    return last


# -- tests ----------------------------------------------------------------------------------


async def test_sync_json_infer(settings_for: Callable[..., PlazaSettings]) -> None:
    settings = settings_for("add_sub")
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    async with running_worker(settings, "add_sub"), http(settings) as client:
        response = await client.post("/v2/models/add_sub/infer", json=add_sub_json(a, b, id="mine"))
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/json")
        doc = response.json()
        assert (
            doc["id"] == "mine" and doc["model_name"] == "add_sub" and doc["model_version"] == "1"
        )
        out = outputs_by_name(doc)
        assert out["OUTPUT0"]["shape"] == [2, 16] and out["OUTPUT0"]["datatype"] == "INT32"
        assert out["OUTPUT0"]["data"] == (a + b).reshape(-1).tolist()
        assert out["OUTPUT1"]["data"] == (a - b).reshape(-1).tolist()

        versioned = await client.post(
            "/v2/models/add_sub/versions/1/infer",
            json=add_sub_json(a[:1], b[:1], outputs=[{"name": "OUTPUT1"}]),
        )
        assert versioned.status_code == 200, versioned.text
        assert [o["name"] for o in versioned.json()["outputs"]] == ["OUTPUT1"]
        assert len(versioned.json()["id"]) == 32  # no client id: the correlation id


async def test_binary_extension_infer(settings_for: Callable[..., PlazaSettings]) -> None:
    settings = settings_for("identity")
    x = np.linspace(-1, 1, 3 * 50, dtype=np.float32).reshape(3, 50)
    async with running_worker(settings, "identity"), http(settings) as client:
        body, headers = identity_binary(x)
        response = await client.post("/v2/models/identity/infer", content=body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/octet-stream"
        header, raw = split_binary(response)
        (output,) = header["outputs"]
        assert output["parameters"]["binary_data_size"] == x.nbytes == len(raw)
        np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(output["shape"]), x)


async def test_async_job_submit_then_poll(settings_for: Callable[..., PlazaSettings]) -> None:
    settings = settings_for("add_sub")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    async with running_worker(settings, "add_sub"), http(settings) as client:
        response = await client.post("/v2/models/add_sub/jobs", json=add_sub_json(a, a))
        assert response.status_code == 202, response.text
        job_id = response.json()["job_id"]
        done = await poll_until(client, job_id, "done")
        assert done["id"] == job_id and done["model_name"] == "add_sub"
        assert outputs_by_name(done)["OUTPUT0"]["data"] == (2 * a).reshape(-1).tolist()
        binary = await client.get(f"/v2/jobs/{job_id}", params={"binary_data_output": "true"})
        header, raw = split_binary(binary)
        assert header["status"] == "done" and len(raw) == 2 * a.nbytes


async def test_unknown_model_and_job_are_404(settings_for: Callable[..., PlazaSettings]) -> None:
    async with http(settings_for("identity")) as client:
        for response in (
            await client.post("/v2/models/nope/infer", json={"inputs": []}),
            await client.post("/v2/models/identity/versions/9/infer", json={"inputs": []}),
            await client.get("/v2/models/nope"),
        ):
            assert response.status_code == 404
            assert response.json()["code"] == "model_not_found"
            assert "nope" in response.json()["error"] or "9" in response.json()["error"]
        job = await client.get("/v2/jobs/never-submitted")
        assert job.status_code == 404 and job.json()["code"] == "job_not_found"


async def test_bad_input_is_400(settings_for: Callable[..., PlazaSettings]) -> None:
    a = np.zeros((1, 8), dtype=np.int32)  # add_sub wants [batch, 16]
    async with http(settings_for("add_sub")) as client:
        cases = [
            (add_sub_json(a, a), "does not match dims"),
            (
                {
                    "inputs": [
                        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0] * 16}
                    ]
                },
                "datatype",
            ),
            (
                {
                    "inputs": [
                        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [0] * 15}
                    ]
                },
                "data elements",
            ),
        ]
        for doc, message in cases:
            response = await client.post("/v2/models/add_sub/infer", json=doc)
            assert response.status_code == 400, response.text
            assert (
                response.json()["code"] == "invalid_input" and message in response.json()["error"]
            )
        bad = await client.post("/v2/models/add_sub/jobs", content=b"{oops")
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]


async def test_sync_timeout_answers_504_with_a_pollable_job(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("identity", sync_timeout_s=1.0)
    x = np.ones((1, 4), dtype=np.float32)
    async with http(settings) as client:
        body, headers = identity_binary(x)
        response = await client.post("/v2/models/identity/infer", content=body, headers=headers)
        assert response.status_code == 504, response.text
        late = response.json()
        assert late["code"] == "timeout" and late["job_id"]

        # parameters.timeout (us) shortens the wait and sets the deadline the worker enforces
        body, headers = identity_binary(x, parameters={"timeout": 200_000})
        response = await client.post("/v2/models/identity/infer", content=body, headers=headers)
        assert response.status_code == 504, response.text
        expired = response.json()

        assert (await client.get(f"/v2/jobs/{late['job_id']}")).json()["status"] == "pending"
        async with running_worker(settings, "identity"):
            done = await poll_until(client, late["job_id"], "done")
            assert outputs_by_name(done)["OUTPUT0"]["data"] == [1.0] * 4
            failed = await poll_until(client, expired["job_id"], "error")
            assert failed["code"] == "timeout"


async def test_ready_flips_with_a_live_worker(settings_for: Callable[..., PlazaSettings]) -> None:
    settings = settings_for("identity")
    async with http(settings) as client:
        assert (await client.get("/v2/health/live")).status_code == 200
        response = await client.get("/v2/health/ready")
        assert response.status_code == 503
        assert any("no live worker" in r for r in response.json()["reasons"])
        assert (await client.get("/v2/models/identity/ready")).status_code == 503

        async def status(path: str, code: int) -> bool:
            return (await client.get(path)).status_code == code

        async with running_worker(settings, "identity"):
            await wait_for(lambda: status("/v2/health/ready", 200), 30, "ready")
            assert (await client.get("/v2/models/identity/versions/1/ready")).status_code == 200
        await wait_for(lambda: status("/v2/health/ready", 503), 30, "not ready after stop")


def _tritonclient_session(url: str) -> dict[str, Any]:
    """tritonclient.http, unmodified, against the gateway (run in one thread: gevent)."""
    import tritonclient.http as tc

    client = tc.InferenceServerClient(url=url.removeprefix("http://"))
    try:
        x = np.arange(32, dtype=np.int32).reshape(2, 16)
        y = np.ones((2, 16), dtype=np.int32)
        found: dict[str, Any] = {
            "live": client.is_server_live(),
            "ready": client.is_server_ready(),
            "model_ready": client.is_model_ready("add_sub"),
            "metadata": client.get_model_metadata("add_sub"),
            "server": client.get_server_metadata(),
        }
        for binary in (True, False):
            inputs = [
                tc.InferInput("INPUT0", [2, 16], "INT32").set_data_from_numpy(
                    x, binary_data=binary
                ),
                tc.InferInput("INPUT1", [2, 16], "INT32").set_data_from_numpy(
                    y, binary_data=binary
                ),
            ]
            outputs = [
                tc.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")
            ]
            result = client.infer("add_sub", inputs, outputs=outputs, request_id=f"tc-{binary}")
            found[f"sum-{binary}"] = result.as_numpy("OUTPUT0")
            found[f"diff-{binary}"] = result.as_numpy("OUTPUT1")
            found[f"id-{binary}"] = result.get_response()["id"]
        default = client.infer("add_sub", inputs)  # no outputs: all, binary
        found["default"] = default.as_numpy("OUTPUT0")
        try:
            client.get_model_metadata("nope")
        except tc.InferenceServerException as exc:
            found["missing"] = (exc.status(), exc.message())
        return found
    finally:
        client.close()


async def test_tritonclient_http_works_unmodified(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("add_sub")
    x = np.arange(32, dtype=np.int32).reshape(2, 16)
    async with running_worker(settings, "add_sub"), serving(settings) as url:
        async with httpx.AsyncClient(base_url=url, trust_env=False) as probe:
            await wait_for(lambda: _is_ok(probe, "/v2/health/ready"), 30, "the gateway to be ready")
        found = await asyncio.to_thread(_tritonclient_session, url)
    assert found["live"] and found["ready"] and found["model_ready"]
    meta = found["metadata"]
    assert meta["name"] == "add_sub" and meta["versions"] == ["1"]
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    assert found["server"]["name"] == "plaza"
    for binary in (True, False):
        np.testing.assert_array_equal(found[f"sum-{binary}"], x + 1)
        np.testing.assert_array_equal(found[f"diff-{binary}"], x - 1)
        assert found[f"id-{binary}"] == f"tc-{binary}"
    np.testing.assert_array_equal(found["default"], x + 1)
    assert found["missing"][0] == "404" and "nope" in found["missing"][1]


async def _is_ok(client: httpx.AsyncClient, path: str) -> bool:
    return (await client.get(path)).status_code == 200
