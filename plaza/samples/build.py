"""Build sample models into a repository: read each config.pbtxt, write the model file and
a stamp, skip what is already built.

Every model's ``<repository>/<model>/config.pbtxt`` is the source of truth for its tensor
names, dtypes, shapes and file name. A repository that lacks one gets a copy of the committed
config (``source``, the checkout's model_repository by default); nothing ever overwrites an
existing config. ``1/build-info.json`` records what the file was built from; a model whose
stamp matches its recipe, its config's tensors and the file's SHA-256 is left alone unless
``force`` is given, so building again is quick and changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plaza.errors import PlazaError
from plaza.modelconfig import ModelSpec, load_model_config
from plaza.repository import CONFIG_FILENAME
from plaza.samples.ensembles import ENSEMBLE_NAMES, prepare_ensemble
from plaza.samples.errors import BuildError
from plaza.samples.files import atomic_write, sha256_file
from plaza.samples.graph import IR_VERSION, OPSET
from plaza.samples.recipes import MODEL_NAMES, RECIPES, Recipe
from plaza.samples.torchscript import import_torch

VERSION = "1"
STAMP_FILENAME = "build-info.json"
COMMITTED_REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"
"""The checkout's model_repository (its config.pbtxt files are committed)."""


@dataclass(frozen=True)
class BuildResult:
    """What happened to one model: 'built', 'up to date', 'skipped' or 'failed'."""

    name: str
    status: str
    detail: str = ""


def default_repository() -> Path:
    """The checkout's model_repository, or ``./model_repository`` outside a checkout."""
    return COMMITTED_REPOSITORY if COMMITTED_REPOSITORY.is_dir() else Path("model_repository")


def default_source() -> Path | None:
    """Where missing configs are copied from: the checkout's repository, if there is one."""
    return COMMITTED_REPOSITORY if COMMITTED_REPOSITORY.is_dir() else None


def _ensure_config(folder: Path, source: Path | None) -> str:
    """Copy the committed config.pbtxt into ``folder`` when it has none; a note for the log."""
    target = folder / CONFIG_FILENAME
    committed = source / folder.name / CONFIG_FILENAME if source else None
    if target.is_file():
        differs = (
            committed is not None
            and committed.is_file()
            and committed.resolve() != target.resolve()
            and committed.read_bytes() != target.read_bytes()
        )
        return f"; note: {target} differs from {committed}, built from it" if differs else ""
    if committed is None or not committed.is_file():
        raise BuildError(f"{target} is missing and there is no committed config to copy")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(committed, target)
    return f"; {CONFIG_FILENAME} copied from {committed}"


def _load_spec(folder: Path, recipe: Recipe) -> ModelSpec:
    """The model's parsed config; BuildError unless it names the recipe's platform."""
    spec = load_model_config(folder / CONFIG_FILENAME)
    if spec.platform != recipe.platform:
        raise BuildError(
            f"{folder / CONFIG_FILENAME}: platform {spec.platform!r}, but the {recipe.name} "
            f"sample is built as {recipe.platform!r}",
            model=recipe.name,
        )
    return spec


def _signature(spec: ModelSpec) -> dict[str, Any]:
    """The parts of the config the model file depends on."""
    tensors = [(t.name, t.datatype, list(t.dims)) for t in (*spec.inputs, *spec.outputs)]
    return {"batched": spec.max_batch_size > 0, "tensors": tensors}


def recipe_digest(recipe: Recipe, spec: ModelSpec) -> str:
    """A digest of everything the model file is built from."""
    source = {
        "name": recipe.name,
        "revision": recipe.revision,
        "opset": OPSET,
        "ir_version": IR_VERSION,
        "inputs": recipe.fingerprint(spec),
        "config": _signature(spec),
    }
    return hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()


def _is_up_to_date(model_file: Path, stamp: Path, digest: str) -> bool:
    if not (model_file.is_file() and stamp.is_file()):
        return False
    try:
        info = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(
        info.get("recipe") == digest
        and info.get("bytes") == model_file.stat().st_size
        and info.get("sha256") == sha256_file(model_file)
    )


def _write_stamp(stamp: Path, recipe: Recipe, model_file: Path, digest: str) -> None:
    info = {
        "model": recipe.name,
        "file": model_file.name,
        "recipe": digest,
        "sha256": sha256_file(model_file),
        "bytes": model_file.stat().st_size,
    }
    atomic_write(stamp, (json.dumps(info, indent=2, sort_keys=True) + "\n").encode())


def _build(folder: Path, recipe: Recipe, force: bool, note: str) -> BuildResult:
    """Build (or skip) the model file of an existing, parsed config."""
    spec = _load_spec(folder, recipe)
    version_dir = folder / VERSION
    model_file = version_dir / spec.default_model_filename
    stamp = version_dir / STAMP_FILENAME
    digest = recipe_digest(recipe, spec)
    companions_there = all((version_dir / f).is_file() for f in recipe.companions)
    if not force and companions_there and _is_up_to_date(model_file, stamp, digest):
        return BuildResult(recipe.name, "up to date", f"{model_file}{note}")
    if recipe.needs_torch and import_torch() is None:
        reason = "torch is not importable (install the 'torch' extra to build it)"
        return BuildResult(recipe.name, "skipped", reason)
    version_dir.mkdir(exist_ok=True)
    started = time.perf_counter()
    recipe.write(spec, model_file)
    elapsed = time.perf_counter() - started
    _write_stamp(stamp, recipe, model_file, digest)
    size = model_file.stat().st_size
    detail = f"{model_file} ({size / 1e6:.2f} MB, {elapsed:.2f} s){note}"
    return BuildResult(recipe.name, "built", detail)


def build_model(
    repository: Path, recipe: Recipe, force: bool = False, source: Path | None = None
) -> BuildResult:
    """Build one model into ``repository`` (or skip it when up to date); errors become a
    'failed' result naming the cause."""
    folder = repository / recipe.name
    try:
        note = _ensure_config(folder, source)
        return _build(folder, recipe, force, note)
    except PlazaError as exc:  # BuildError, or ConfigError from a bad config.pbtxt
        return BuildResult(recipe.name, "failed", exc.message)


def build_repository(
    repository: Path,
    *,
    force: bool = False,
    models: Sequence[str] | None = None,
    source: Path | None = None,
) -> list[BuildResult]:
    """Build the selected sample models (all by default) into ``repository``; the sample
    ensembles get their config and version folder (status 'ready').

    ``source`` is where a missing config.pbtxt is copied from (default: the checkout's
    model_repository). BuildError for an unknown model name.
    """
    known = (*MODEL_NAMES, *ENSEMBLE_NAMES)
    wanted = list(models) if models else list(known)
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise BuildError(f"unknown model(s) {unknown}; known: {', '.join(known)}")
    repository.mkdir(parents=True, exist_ok=True)
    origin = source if source is not None else default_source()
    results = [build_model(repository, r, force, origin) for r in RECIPES if r.name in wanted]
    return results + [_ensemble(repository, n, origin) for n in ENSEMBLE_NAMES if n in wanted]


def _ensemble(repository: Path, name: str, source: Path | None) -> BuildResult:
    """An ensemble's config and version folder ('ready'), or 'failed' with the cause."""
    try:
        return BuildResult(name, "ready", prepare_ensemble(repository, name, source))
    except BuildError as exc:
        return BuildResult(name, "failed", exc.message)
