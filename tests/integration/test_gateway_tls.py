"""TLS on both fronts: certificates made by the openssl CLI for this test, a gateway that
serves HTTPS and gRPC over TLS with them, and tritonclient / httpx as the clients.

With a client CA configured (mutual TLS), a client without a certificate is refused on
both fronts and one with a certificate the CA signed is served.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from plaza.settings import PlazaSettings
from tests.pki import Pki, make_pki
from tests.support import gateway_fronts, running_worker


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def test_both_fronts_serve_tls(settings_for: Callable[..., PlazaSettings], pki: Pki) -> None:
    settings = settings_for("identity", tls_cert_file=pki.server_cert, tls_key_file=pki.server_key)
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    async with gateway_fronts(settings) as gw, running_worker(settings, "identity"):
        assert gw.http_url.startswith("https://")
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=pki.ca)) as http:
            live = await http.get(f"{gw.http_url}/v2/health/live")
        secure = grpcclient.InferenceServerClient(
            gw.grpc_address, ssl=True, root_certificates=str(pki.ca)
        )
        plain = grpcclient.InferenceServerClient(gw.grpc_address)
        try:
            item = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
            item.set_data_from_numpy(x)
            answer = await secure.infer("identity", [item])
            with pytest.raises(InferenceServerException):
                await plain.is_server_live()
        finally:
            await secure.close()
            await plain.close()
        with pytest.raises(httpx.HTTPError):  # plain text to the HTTPS port
            async with httpx.AsyncClient() as http:
                await http.get(gw.http_url.replace("https://", "http://") + "/v2/health/live")
    assert live.status_code == 200
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), x)


async def test_a_client_ca_requires_client_certificates(
    settings_for: Callable[..., PlazaSettings], pki: Pki
) -> None:
    settings = settings_for(
        "identity",
        tls_cert_file=pki.server_cert,
        tls_key_file=pki.server_key,
        tls_client_ca_file=pki.ca,
    )
    async with gateway_fronts(settings) as gw:
        with_cert = grpcclient.InferenceServerClient(
            gw.grpc_address,
            ssl=True,
            root_certificates=str(pki.ca),
            private_key=str(pki.client_key),
            certificate_chain=str(pki.client_cert),
        )
        without = grpcclient.InferenceServerClient(
            gw.grpc_address, ssl=True, root_certificates=str(pki.ca)
        )
        try:
            served = await with_cert.is_server_live()
            with pytest.raises(InferenceServerException):
                await without.is_server_live()
        finally:
            await with_cert.close()
            await without.close()
        url = f"{gw.http_url}/v2/health/live"
        with_client_cert = ssl.create_default_context(cafile=pki.ca)
        with_client_cert.load_cert_chain(pki.client_cert, pki.client_key)
        async with httpx.AsyncClient(verify=with_client_cert) as http:
            http_served = await http.get(url)
        with pytest.raises(httpx.HTTPError):
            async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=pki.ca)) as http:
                await http.get(url)
    assert served is True
    assert http_served.status_code == 200
