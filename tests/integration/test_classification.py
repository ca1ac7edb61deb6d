"""Triton's classification extension through the whole stack: tritonclient's ``class_count``
over HTTP and gRPC, the gateway, Kafka, a worker of the real mlp and Redis, against the
logits the same model gives without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio

from plaza.settings import PlazaSettings
from tests.support import REPOSITORY, gateway_fronts, running_worker

LABELS = [f"class-{i}" for i in range(10)]


def labelled_mlp(root: Path) -> Path:
    """A repository holding mlp (its built version) with labels for its logits."""
    (root / "mlp").mkdir(parents=True)
    (root / "mlp" / "1").symlink_to(REPOSITORY / "mlp" / "1")
    config = (REPOSITORY / "mlp" / "config.pbtxt").read_text()
    labelled = config.replace('name: "logits"', 'name: "logits"\n    label_filename: "labels.txt"')
    assert labelled != config
    (root / "mlp" / "config.pbtxt").write_text(labelled)
    (root / "mlp" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    return root


def expected_top(logits: np.ndarray, count: int) -> list[list[str]]:
    return [
        [f"{row[i]:f}:{i}:{LABELS[i]}" for i in np.argsort(-row, kind="stable")[:count]]
        for row in logits
    ]


async def test_class_count_answers_the_top_classes_with_their_labels(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"repository": labelled_mlp(tmp_path / "repo")})
    x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
    async with running_worker(settings, "mlp"), gateway_fronts(settings) as gw:
        http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
        grpc = grpc_aio.InferenceServerClient(gw.grpc_address)
        try:
            h_in = http_aio.InferInput("input", [2, 512], "FP32")
            h_in.set_data_from_numpy(x)
            plain = await http.infer("mlp", [h_in])
            logits = plain.as_numpy("logits")
            assert logits.shape == (2, 10)
            wanted = [http_aio.InferRequestedOutput("logits", class_count=3)]
            over_http = await http.infer("mlp", [h_in], outputs=wanted)
            g_in = grpc_aio.InferInput("input", [2, 512], "FP32")
            g_in.set_data_from_numpy(x)
            wanted_g = [grpc_aio.InferRequestedOutput("logits", class_count=3)]
            over_grpc = await grpc.infer("mlp", [g_in], outputs=wanted_g)
            assert "classification" in (await http.get_server_metadata())["extensions"]
        finally:
            await http.close()
            await grpc.close()
    for result in (over_http, over_grpc):
        top = result.as_numpy("logits")
        assert top.shape == (2, 3)
        assert [[v.decode() for v in row] for row in top] == expected_top(logits, 3)
