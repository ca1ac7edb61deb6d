"""Simulated-device models (``backend: "plaza_simulated"``): no file to build.

Such a model still needs a version folder, since a version folder is what makes a version
servable (Triton's layout); the folders are git-ignored, so a fresh checkout lacks them.
"""

from __future__ import annotations

from pathlib import Path

from plaza.modelconfig import BACKEND_SIMULATED, load_model_config
from plaza.repository import CONFIG_FILENAME

VERSION_FOLDER = "1"


def simulated_models(repository: Path) -> list[str]:
    """The models whose config.pbtxt names the simulated backend, sorted."""
    return sorted(
        config.parent.name
        for config in repository.glob(f"*/{CONFIG_FILENAME}")
        if load_model_config(config).platform == BACKEND_SIMULATED
    )


def version_folders(folder: Path) -> list[Path]:
    """The model's numeric version folders, in version order."""
    found = [p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(found, key=lambda p: int(p.name))


def ensure_simulated_version(folder: Path) -> list[Path]:
    """The version folders of the model at ``folder``, making ``<folder>/1`` when it has none."""
    found = version_folders(folder)
    if found:
        return found
    (folder / VERSION_FOLDER).mkdir()
    return [folder / VERSION_FOLDER]


def simulated_version_folders(repository: Path) -> list[Path]:
    """Every version folder of every simulated model, version 1 made where none exists."""
    return [
        version
        for name in simulated_models(repository)
        for version in ensure_simulated_version(repository / name)
    ]


def ensure_servable(repository: Path, model: str) -> None:
    """Give a simulated ``model`` its version folder 1 when it has none; other models (and
    a missing config, which the repository reports itself) are left alone."""
    config = repository / model / CONFIG_FILENAME
    if config.is_file() and load_model_config(config).platform == BACKEND_SIMULATED:
        ensure_simulated_version(config.parent)
