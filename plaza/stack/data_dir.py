"""The services' data dir: made and checked before anything starts, and, for a fresh start,
cleared of what Plaza made there and of nothing else.

A data dir holds one subfolder per service (``kafka/``, ``redis/``), each with a layout
its service knows (:attr:`KafkaCluster.OWN_ENTRIES`, :attr:`RedisServer.OWN_ENTRIES`).
Clearing checks every entry against that layout first and deletes only when all match:
a ``--data-dir`` pointed at the wrong folder is refused, never emptied.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from plaza.stack.errors import ServiceError, ServiceOptionError

Layout = Mapping[str, Sequence[str]]
"""Subfolder name -> the patterns (full-match regular expressions) of the entries in it."""


def prepare_data_dir(path: Path | str, option: str = "--data-dir") -> Path:
    """``path`` made absolute and created if missing; :class:`ServiceOptionError` naming
    ``option`` if it is not a folder this process can write to."""
    resolved = Path(path).resolve()
    if resolved.exists() and not resolved.is_dir():
        raise ServiceOptionError(f"{option} {path}: exists and is not a folder")
    try:
        resolved.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ServiceOptionError(f"{option} {path}: cannot create it ({_reason(exc)})") from exc
    if not os.access(resolved, os.W_OK | os.X_OK):
        raise ServiceOptionError(f"{option} {path}: not writable")
    return resolved


def foreign_entries(data_dir: Path, layout: Layout) -> list[str]:
    """Entries of ``data_dir`` (and of its service subfolders) that ``layout`` does not
    name, relative to ``data_dir``; a link or a plain file where a folder belongs counts."""
    foreign = []
    for entry in sorted(data_dir.iterdir()):
        patterns = layout.get(entry.name)
        if patterns is None or entry.is_symlink() or not entry.is_dir():
            foreign.append(entry.name)
            continue
        own = [re.compile(pattern) for pattern in patterns]
        foreign += [
            f"{entry.name}/{inner.name}"
            for inner in sorted(entry.iterdir())
            if not any(regex.fullmatch(inner.name) for regex in own)
        ]
    return foreign


def clear_data_dir(data_dir: Path, layout: Layout, option: str = "--fresh") -> None:
    """Delete the service subfolders of ``data_dir``; refuse (deleting nothing) with
    :class:`ServiceOptionError` if it holds anything ``layout`` does not name."""
    try:
        foreign = foreign_entries(data_dir, layout)
    except OSError as exc:
        raise ServiceOptionError(f"{option}: cannot read {data_dir} ({_reason(exc)})") from exc
    if foreign:
        more = len(foreign) - 5
        shown = ", ".join(foreign[:5]) + (f" and {more} more" if more > 0 else "")
        raise ServiceOptionError(
            f"{option}: {data_dir} holds {shown}, which Plaza did not make there; deleted "
            "nothing (name an empty or Plaza-only --data-dir)"
        )
    for name in layout:
        try:
            shutil.rmtree(data_dir / name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            where = data_dir / name
            raise ServiceError(f"{option}: cannot delete {where} ({_reason(exc)})") from exc


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)
