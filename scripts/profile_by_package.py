"""Sum a cProfile dump's own time (tottime) by package: where a process's Python time goes.

    python scripts/profile_by_package.py var/profile/identity-kafka-c64-sx-p1/worker.prof

The event loop's ``run`` (C code and idle waits) and coroutine frames whose time spans
their awaits (aiokafka's consumer ``stop``) are left out: they hold wall time, not CPU.
"""

from __future__ import annotations

import collections
import pstats
import sys

SKIP = {("runners.py", "run"), ("consumer.py", "stop")}


def package(file: str, fn: str) -> str:
    if file.endswith("streams.py") and fn in ("write", "writelines"):
        return "socket writes (asyncio streams)"
    if "site-packages/" in file:
        return file.split("site-packages/")[1].split("/")[0]
    if "/plaza/" in file:
        return "plaza"
    if file == "~":
        return "builtins (C)"
    if "/lib/python3" in file:
        return "stdlib " + file.split("/lib/python3")[1].split("/")[1].removesuffix(".py")
    return file


def main(paths: list[str]) -> None:
    for path in paths:
        stats = pstats.Stats(path)
        totals: collections.Counter[str] = collections.Counter()
        for (file, _, fn), row in stats.stats.items():  # type: ignore[attr-defined]
            if (file.rsplit("/", 1)[-1], fn) in SKIP:
                continue
            totals[package(file, fn)] += row[2]
        whole = sum(totals.values())
        print(f"== {path}: {whole:.2f} s of Python-level time")
        for name, seconds in totals.most_common(8):
            print(f"   {name:36s} {seconds:6.2f} s {100 * seconds / whole:5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1:])
