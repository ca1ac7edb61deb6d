"""A model repository in Triton's layout: ``<root>/<model>/config.pbtxt`` and
``<root>/<model>/<version>/<model file>``.

Reading is cheap and repeatable (nothing is cached), so ``poll`` mode can simply read again.
With a config name (Triton's ``--model-config-name``), a model's
``<model>/configs/<name>.pbtxt``, where it has one, is read in place of its config.pbtxt.
An ONNX model's folder may go without config.pbtxt: its config is then made from the model
(``plaza.autocomplete``, remembered per file), as Triton auto-completes one; so may a Python
backend model's, whose ``model.py`` then makes it (``auto_complete_config``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from plaza.autocomplete import MODEL_FILENAME, PYTHON_FILENAME, complete, model_file
from plaza.errors import ConfigError, InvalidInput, ModelNotFound
from plaza.modelconfig import BACKEND_SIMULATED, ModelSpec, load_model_config, parse_model_config
from plaza.naming import CONFIG_NAME_PATTERN, check_model_name, folder_version
from plaza.settings import PlazaSettings

CONFIG_FILENAME = "config.pbtxt"
DIGIT_FOLDERS = "[0-9]*"
"""The subfolders that make a folder without a config a model (a glob pattern)."""
CONFIGS_DIR = "configs"
"""Where a model keeps its named configs (``configs/<name>.pbtxt``, Triton's layout)."""


@dataclass(frozen=True, slots=True)
class ModelVersion:
    """One servable version: its number and the file the backend loads."""

    spec: ModelSpec
    version: int
    path: Path


class ModelRepository:
    """Reads models, versions and model files from one folder."""

    def __init__(
        self, root: Path | str, config_name: str = "", *, auto_complete: bool = True
    ) -> None:
        """``config_name``: the ``configs/<name>.pbtxt`` to prefer (settings'
        ``model_config_name``); empty: config.pbtxt only. ``auto_complete``: complete the
        configs that leave things out (``plaza.autocomplete``); off (Triton's
        ``--disable-auto-complete-config``), a config is used as written."""
        if not re.fullmatch(CONFIG_NAME_PATTERN, config_name):
            raise ConfigError(f"model config name {config_name!r} is not a file name's stem")
        self.root = Path(root)
        self.config_name = config_name
        self.auto_complete = auto_complete

    @classmethod
    def of(cls, settings: PlazaSettings) -> ModelRepository:
        """The repository ``settings`` name, read as they say."""
        return cls(
            settings.repository,
            settings.model_config_name,
            auto_complete=not settings.disable_auto_complete_config,
        )

    def complete(self, config: mc.ModelConfig, folder: Path, source: str) -> None:
        """Complete ``config``, read from ``source``, from the model in ``folder``
        (``plaza.autocomplete``), unless completion is off."""
        if self.auto_complete:
            complete(config, folder, source)

    def model_names(self) -> list[str]:
        """Every folder that holds a config.pbtxt, or a subfolder whose name starts with a
        digit holding a model.onnx or a model.py (a config made from the model), sorted.
        One whose subfolders name no version (``01/``) is listed, and fails to load
        (``spec``: a bad_config), as a model folder without a version fails in Triton."""
        if not self.root.is_dir():
            raise ConfigError(f"model repository {self.root} is not a folder", file=str(self.root))
        configured = {p.parent.name for p in self.root.glob(f"*/{CONFIG_FILENAME}")}
        if self.config_name:
            named = self.root.glob(f"*/{CONFIGS_DIR}/{self.config_name}.pbtxt")
            configured |= {p.parent.parent.name for p in named}
        unconfigured = {
            p.parent.parent.name
            for filename in (MODEL_FILENAME, PYTHON_FILENAME)
            for p in self.root.glob(f"*/{DIGIT_FOLDERS}/{filename}")
        }
        return sorted(configured | {n for n in unconfigured if _is_model_name(n)})

    def _model_dir(self, name: str) -> Path:
        # check_model_name allows no slash and no "..", so the folder is a direct child of
        # the root; it may be a symlink to a folder elsewhere, as in Triton.
        check_model_name(name)
        path = self.root / name
        if not self.config_path(path).is_file() and not _digit_folder_model_file(path):
            raise ModelNotFound(f"model {name!r} is not in the repository", model=name)
        return path

    def config_path(self, folder: Path) -> Path:
        """The config file of the model in ``folder``: ``configs/<config_name>.pbtxt``
        where there is one, else config.pbtxt (which may not exist)."""
        if self.config_name:
            named = folder / CONFIGS_DIR / f"{self.config_name}.pbtxt"
            if named.is_file():
                return named
        return folder / CONFIG_FILENAME

    def spec(self, name: str) -> ModelSpec:
        """The parsed config of ``name``, an ONNX model's completed from its model file
        (``plaza.autocomplete``: when it has no config.pbtxt, or one that names no inputs
        or outputs), a Python model's by its ``auto_complete_config``; ModelNotFound or
        ConfigError."""
        folder = self._model_dir(name)
        path = self.config_path(folder)
        if path.is_file():
            return load_model_config(path, lambda c: self.complete(c, folder, str(path)), name)
        if not _has_model_file(folder):
            raise ConfigError(
                f"{folder}: no config.pbtxt, and no version folder holds a model file "
                "(a version folder is named by a number with no leading zero: 1, 12)",
                file=str(folder),
            )
        source = f"{folder} (no config.pbtxt: made from its model file)"
        if not self.auto_complete:
            source = f"{folder} (no config.pbtxt, and completion is off)"
        return parse_model_config(
            "",
            source=source,
            default_name=name,
            complete=lambda c: self.complete(c, folder, source),
        )

    def available_versions(self, name: str) -> list[int]:
        """Version folders present on disk (``plaza.naming.folder_version``; any other
        folder is ignored, as in Triton)."""
        folder = self._model_dir(name)
        found = (folder_version(p.name) for p in folder.iterdir() if p.is_dir())
        return sorted(v for v in found if v is not None)

    def served_versions(self, name: str, spec: ModelSpec | None = None) -> list[ModelVersion]:
        """The versions the version policy selects, each with its model file checked."""
        spec = spec or self.spec(name)
        selected = spec.version_policy.select(self.available_versions(name))
        if not selected:
            raise ConfigError(
                f"{self.root / name}: no version folder matches the version policy "
                f"({spec.version_policy.kind})",
                file=str(self.root / name),
            )
        return [self._version(spec, v) for v in selected]

    def _version(self, spec: ModelSpec, version: int) -> ModelVersion:
        folder = self.root / spec.name / str(version)
        if spec.platform == BACKEND_SIMULATED or spec.is_ensemble:
            return ModelVersion(spec, version, folder)  # no model file (may be an empty folder)
        path = folder / spec.default_model_filename
        if not path.is_file():
            raise ConfigError(
                f"{path}: model file missing (platform {spec.platform}, "
                f"field 'default_model_filename' = {spec.default_model_filename!r})",
                file=str(path),
                field="default_model_filename",
            )
        return ModelVersion(spec, version, path)


def _has_model_file(folder: Path) -> bool:
    """A version folder of ``folder`` holds a model file a config can be made from."""
    return any(model_file(folder, f) is not None for f in (MODEL_FILENAME, PYTHON_FILENAME))


def _digit_folder_model_file(folder: Path) -> bool:
    """A subfolder of ``folder`` whose name starts with a digit holds a model file: what
    makes a folder without a config a model in the listing (``model_names``), a version
    folder or not (``01/``)."""
    return any(any(folder.glob(f"{DIGIT_FOLDERS}/{f}")) for f in (MODEL_FILENAME, PYTHON_FILENAME))


def _is_model_name(name: str) -> bool:
    try:
        check_model_name(name)
    except InvalidInput:
        return False
    return True


def file_in(folder: Path, name: str) -> Path | None:
    """``folder / name`` when ``name`` names a file directly in ``folder`` (a config's file
    names: labels, warmup data), else None: no path may lead out of a model's folder."""
    base = folder.resolve()
    path = (base / name).resolve()
    return path if path.parent == base else None
