"""The sample ensembles: no file to build, a config and a version folder.

* ``text_embed``: TEXT (BYTES) -> ``text_embed_tokenizer`` (model.py) -> ``text_embed_encoder``
  (ONNX) -> ``text_embed_pool`` (model.py) -> embedding, the sentence-transformers embedding
  of all-MiniLM-L6-v2.
* ``numeric_dag``: RAW -> ``preprocess`` -> ``mlp`` and ``identity`` side by side (fan-out)
  -> ``combine`` of both (fan-in) -> COMBINED.

Their steps are sample models built by their own recipes. An ensemble's version folder may
be empty, as in Triton; version folders are git-ignored, so the builder makes ``1/``.
"""

from __future__ import annotations

from pathlib import Path

from plaza.repository import CONFIG_FILENAME
from plaza.samples.errors import BuildError

ENSEMBLE_NAMES = ("text_embed", "numeric_dag")
VERSION_FOLDER = "1"


def prepare_ensemble(repository: Path, name: str, source: Path | None) -> str:
    """Give the ensemble ``name`` its config (copied from ``source`` when missing) and its
    version folder; a line for the log. BuildError when there is no config to copy."""
    folder = repository / name
    config = folder / CONFIG_FILENAME
    note = ""
    if not config.is_file():
        committed = source / name / CONFIG_FILENAME if source else None
        if committed is None or not committed.is_file():
            raise BuildError(f"{config} is missing and there is no committed config to copy")
        folder.mkdir(parents=True, exist_ok=True)
        config.write_bytes(committed.read_bytes())
        note = f"; {CONFIG_FILENAME} copied from {committed}"
    if not any(p.is_dir() and p.name.isdigit() for p in folder.iterdir()):
        (folder / VERSION_FOLDER).mkdir()
    return f"{folder / VERSION_FOLDER} (ensemble: no file){note}"
