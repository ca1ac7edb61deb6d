"""``python -m plaza.samples`` (and scripts/build_models.py): build the sample repository.

python -m plaza.samples [--repository model_repository] [--source DIR] [--force]
                        [--models a,b]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from plaza.errors import PlazaError
from plaza.samples.build import BuildResult, build_repository, default_repository
from plaza.samples.ensembles import ENSEMBLE_NAMES
from plaza.samples.errors import BuildError
from plaza.samples.recipes import MODEL_NAMES
from plaza.samples.simulated import simulated_version_folders


def _check_onnx_available() -> None:
    try:
        import onnx  # noqa: F401
    except ModuleNotFoundError as exc:
        raise BuildError("the onnx package is missing: pip install 'plaza[models]'") from exc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m plaza.samples",
        description="Build Plaza's sample model repository from code: fixed seeds, no downloads.",
    )
    parser.add_argument(
        "--repository",
        type=Path,
        default=default_repository(),
        help=f"target folder (default {default_repository()})",
    )
    parser.add_argument(
        "--source",
        type=Path,
        default=None,
        help="where a missing config.pbtxt is copied from (default: the checkout's "
        "model_repository)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild every model file")
    parser.add_argument(
        "--models",
        default="",
        help=f"comma-separated subset of {','.join((*MODEL_NAMES, *ENSEMBLE_NAMES))} (default all)",
    )
    return parser


def _report(results: list[BuildResult], repository: Path) -> None:
    for result in results:
        stream = sys.stderr if result.status == "failed" else sys.stdout
        print(f"{result.status:>10}  {result.name:<10} {result.detail}", file=stream)
    for folder in simulated_version_folders(repository):
        print(f"{'ready':>10}  {folder.parent.name:<10} {folder} (simulated device: no file)")


def main(argv: Sequence[str] | None = None) -> int:
    """0 when every selected model is built, up to date or skipped; 1 when one failed;
    2 when nothing could be attempted (a bad argument, a missing package, a bad config)."""
    args = _parser().parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        _check_onnx_available()
        results = build_repository(
            args.repository, force=args.force, models=models, source=args.source
        )
        _report(results, args.repository)
    except PlazaError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    return 1 if any(r.status == "failed" for r in results) else 0
