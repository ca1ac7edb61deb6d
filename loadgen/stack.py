"""What loadgen adds to ``plaza.stack`` for benchmarks: model copies with edited configs,
warm-up until every worker answered, fresh work folders.

Services, deployments and processes (workers, gateways, a baseline server) come from
``plaza.stack``; this module keeps only what is loadgen's own.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from plaza.loadgen.inputs import InputSet
from plaza.repository import CONFIG_FILENAME
from plaza.stack import Deployment

ConfigEdit = Callable[[mc.ModelConfig], None]


def copy_model(source: Path, target_repo: Path, model: str, edit: ConfigEdit | None = None) -> Path:
    """``source/model`` into ``target_repo`` (model files linked, not copied), the config
    edited by ``edit``; a version folder ``1/`` is made when the source has none."""
    src, dst = source / model, target_repo / model
    dst.mkdir(parents=True, exist_ok=True)
    versions = [p for p in src.iterdir() if p.is_dir() and p.name.isdigit()]
    for version in versions:
        (dst / version.name).mkdir(exist_ok=True)
        for f in version.iterdir():
            link = dst / version.name / f.name
            if not link.exists():
                link.symlink_to(f.resolve())
    if not versions:
        (dst / "1").mkdir(exist_ok=True)
    config = mc.ModelConfig()
    text_format.Parse((src / CONFIG_FILENAME).read_text(encoding="utf-8"), config)
    if edit is not None:
        edit(config)
    (dst / CONFIG_FILENAME).write_text(text_format.MessageToString(config), encoding="utf-8")
    return dst


def set_parameters(**values: str | int | float) -> ConfigEdit:
    """An edit that sets config ``parameters`` (string values)."""

    def edit(config: mc.ModelConfig) -> None:
        for key, value in values.items():
            config.parameters[key].string_value = str(value)

    return edit


def chain(*edits: ConfigEdit) -> ConfigEdit:
    def edit(config: mc.ModelConfig) -> None:
        for e in edits:
            e(config)

    return edit


async def warm_up(
    dep: Deployment,
    model: str,
    pool: Sequence[InputSet],
    workers: int = 1,
    timeout_s: float = 120.0,
) -> None:
    """Send requests until answers came from ``workers`` distinct workers: every worker has
    its partitions (the group settled) and has run the model once."""
    from plaza.client import PlazaClient

    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    async with PlazaClient(dep.settings()) as client:
        while len(seen) < workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"answers from {len(seen)} of {workers} workers of {model}")
            batch = [client.infer(model, pool[i % len(pool)], timeout_s=30) for i in range(16)]
            for result in await asyncio.gather(*batch):
                seen.add(result.worker)


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path
