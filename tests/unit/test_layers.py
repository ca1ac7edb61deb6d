"""The import layers of docs/architecture.md hold: no import runs upward, none sideways.

Every module of the installed ``plaza`` package is parsed (not imported) and each of its
``import``/``from`` statements that names a Plaza module is checked against what its layer
may use. The generic top-level names of the old layout (``workers``, ``gateway``,
``loadgen``, ``plaza_cli``) may not be imported anywhere, tests and scripts included.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "plaza"

SUBPACKAGES = ("workers", "gateway", "loadgen", "stack", "cli")
"""The layers that are sub-packages of ``plaza``; every other ``plaza.x`` is the core."""

MAY_IMPORT: dict[str, set[str]] = {
    "core": {"core"},
    "stack": {"core", "stack"},
    "workers": {"core", "workers"},
    "gateway": {"core", "gateway"},
    "loadgen": {"core", "stack", "workers", "loadgen"},
    "cli": set(SUBPACKAGES) | {"core"},
}
"""Layer -> the layers its modules may import (docs/architecture.md draws the same)."""

OLD_TOP_LEVEL = ("workers", "gateway", "loadgen", "plaza_cli")


def layer_of(module: str) -> str:
    """``plaza.workers.worker`` -> ``workers``; ``plaza.codec`` -> ``core``."""
    parts = module.split(".")
    if parts[0] != "plaza":
        raise ValueError(f"{module} is not a Plaza module")
    return parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else "core"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, module: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) for every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                yield node.lineno, ".".join([*base, *([node.module] if node.module else [])])
            elif node.module:
                yield node.lineno, node.module


def plaza_files() -> list[Path]:
    """Every module under plaza/, reached through the plaza/workers -> ../workers links, so
    each path spells its installed name."""
    found = []
    for folder, _, files in os.walk(PACKAGE, followlinks=True):
        found += [Path(folder, f) for f in files if f.endswith(".py")]
    return sorted(found)


def test_every_layer_is_present() -> None:
    found = {layer_of(module_name(p)) for p in plaza_files()}
    assert {"core", "workers", "gateway", "loadgen", "stack", "cli"} <= found


def test_no_import_runs_upward_or_sideways() -> None:
    wrong = []
    for path in plaza_files():
        module = module_name(path)
        allowed = MAY_IMPORT[layer_of(module)]
        for line, target in imported_modules(path, module):
            if target.split(".")[0] != "plaza":
                continue
            if layer_of(target) not in allowed:
                wrong.append(f"{module}:{line} imports {target} ({layer_of(target)})")
    assert not wrong, "imports against docs/architecture.md:\n" + "\n".join(wrong)


@pytest.mark.parametrize("folder", ["plaza", "tests", "scripts", "examples"])
def test_old_top_level_names_are_not_imported(folder: str) -> None:
    wrong = []
    paths = plaza_files() if folder == "plaza" else sorted((ROOT / folder).rglob("*.py"))
    for path in paths:
        module = module_name(path) if folder == "plaza" else path.stem
        for line, target in imported_modules(path, module):
            if target.split(".")[0] in OLD_TOP_LEVEL:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "import these as plaza.<name>:\n" + "\n".join(wrong)


def test_the_checker_sees_a_wrong_import(tmp_path: Path) -> None:
    """The parser resolves relative imports, so a violation cannot hide behind a dot."""
    source = tmp_path / "worker.py"
    source.write_text("from ..gateway import app\nfrom . import runner\n")
    found = [t for _, t in imported_modules(source, "plaza.workers.worker")]
    assert found == ["plaza.gateway", "plaza.workers"]
    assert layer_of(found[0]) not in MAY_IMPORT["workers"]
