"""The first requests a fresh worker answers, with and without a ``model_warmup`` sample.

    python scripts/warmup_first_request.py --model mlp_torch --rounds 3

Each round starts a worker of MODEL twice, on a copy of its config with and without a
warmup sample of ``--batch`` zero rows run ``--count`` times (the order alternates from one
round to the next), sends two requests one after the other, and prints their
``compute_infer`` (the worker's own timing of the backend call, ms). Runs on a Kafka and
Redis that already run (``plaza services up``; PLAZA_KAFKA__BOOTSTRAP_SERVERS and
PLAZA_REDIS__URL), under a fresh prefix each time; the repository copies go to a temporary
folder.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import uuid
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from plaza.client import PlazaClient
from plaza.loadgen.inputs import make_inputs
from plaza.modelconfig import load_model_config
from plaza.settings import KafkaSettings, PlazaSettings, RedisSettings, WorkerSettings
from plaza.workers.worker import Worker

REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"


def warmup_entry(model: str, batch: int, count: int) -> str:
    spec = load_model_config(REPOSITORY / model / "config.pbtxt")
    inputs = " ".join(
        f'inputs {{ key: "{t.name}" value {{ data_type: {mc.DataType.Name(t.data_type)} '
        f"dims: [ {', '.join(str(max(d, 1)) for d in t.dims)} ] zero_data: true }} }}"
        for t in spec.config.input
    )
    return f'model_warmup [ {{ name: "zeros" batch_size: {batch} count: {count} {inputs} }} ]\n'


def copy_of(model: str, root: Path, warmup: str) -> Path:
    (root / model).mkdir(parents=True)
    (root / model / "1").symlink_to(REPOSITORY / model / "1")
    text = (REPOSITORY / model / "config.pbtxt").read_text()
    (root / model / "config.pbtxt").write_text(text + warmup)
    return root


async def first_two(settings: PlazaSettings, model: str) -> tuple[float, float]:
    spec = load_model_config(settings.repository / model / "config.pbtxt")
    feeds = make_inputs(spec, 1, 16, np.random.default_rng(1))
    worker = Worker(settings)
    await worker.start()  # loads the model and runs its warmup, if any
    try:
        async with PlazaClient(settings) as client:
            first = await client.infer(model, feeds, timeout_s=120)
            second = await client.infer(model, feeds, timeout_s=120)
    finally:
        await worker.stop()
    return first.timing_us["compute_infer"] / 1e3, second.timing_us["compute_infer"] / 1e3


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp_torch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--count", type=int, default=2)
    args = p.parse_args()
    kafka = os.environ.get("PLAZA_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    redis = os.environ.get("PLAZA_REDIS__URL", "redis://127.0.0.1:6379/0")
    entry = warmup_entry(args.model, args.batch, args.count)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for warm in (False, True) if i % 2 == 0 else (True, False):
                root = copy_of(args.model, Path(tmp) / uuid.uuid4().hex, entry if warm else "")
                prefix = f"warmup{uuid.uuid4().hex[:8]}"
                settings = PlazaSettings(
                    repository=root,
                    kafka=KafkaSettings(bootstrap_servers=kafka, topic_prefix=f"{prefix}."),
                    redis=RedisSettings(url=redis, key_prefix=f"{prefix}:"),
                    worker=WorkerSettings(model=args.model, metrics_port=-1),
                )
                first, second = await first_two(settings, args.model)
                label = "with warmup   " if warm else "without warmup"
                timings = f"first {first:.2f}, second {second:.2f}"
                print(f"round {i + 1} {label} compute_infer ms: {timings}")


if __name__ == "__main__":
    asyncio.run(main())
