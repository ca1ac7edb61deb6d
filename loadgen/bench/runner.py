"""The benchmark suite: ``make bench`` = ``python -m plaza.loadgen.bench`` (not part of make test).

    python -m plaza.loadgen.bench                      # everything (about 10 minutes here)
    python -m plaza.loadgen.bench --only batching,scale
    python -m plaza.loadgen.bench --quick              # shorter windows, one round
    python -m plaza.loadgen.bench --list

It starts its own Kafka and Redis (free loopback ports, under ``--work-dir``), runs each
benchmark's workers and gateway as child processes on them, each benchmark in a Plaza of
its own (topic and key prefix, repository folder), and stops everything at the end. Each
benchmark prints its ratios and writes ``results/bench/<name>.json``; a failing benchmark
is reported and the others still run (exit status 1).
"""

from __future__ import annotations

import argparse
import shutil
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from plaza.loadgen import report_json
from plaza.loadgen.bench.cases import BENCHMARKS
from plaza.loadgen.bench.context import Context
from plaza.loadgen.cli import add_loop_argument, run_load
from plaza.loadgen.stack import fresh_dir
from plaza.loadgen.sweep import environment
from plaza.stack import ProcessGroup, Services


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m plaza.loadgen.bench", description=__doc__.split("\n")[0]
    )
    p.add_argument("--only", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    p.add_argument("--quick", action="store_true", help="shorter windows, one round")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--repository", type=Path, default=Path("model_repository"))
    p.add_argument("--out-dir", type=Path, default=Path("results/bench"))
    p.add_argument("--work-dir", type=Path, default=Path("var/bench"))
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs, data)")
    p.add_argument(
        "--bootstrap-servers",
        help="use this running Kafka instead of starting one (its CPU is then not counted)",
    )
    p.add_argument("--redis-url", help="use this running Redis instead of starting one")
    add_loop_argument(p)
    return p.parse_args(argv)


def _selected(only: str | None) -> list[str]:
    if not only:
        return list(BENCHMARKS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    return names


def _print_ratios(name: str, report: dict[str, Any]) -> None:
    print(f"== {name}")
    for key, value in report.get("ratios", {}).items():
        print(f"   {key}: {value:.3f}" if isinstance(value, float) else f"   {key}: {value}")


async def _run_all(ctx: Context, names: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name in names:
        started = time.monotonic()
        print(f"-- {name} ...", flush=True)
        try:
            report = await BENCHMARKS[name](ctx)
        except Exception as exc:
            traceback.print_exc()
            summary[name] = {"error": f"{type(exc).__name__}: {exc}"}
            ctx.procs.stop_all()
            continue
        finally:
            elapsed = time.monotonic() - started
        report.update(
            benchmark=name, seconds=round(elapsed, 1), environment=environment(), quick=ctx.quick
        )
        path = ctx.out_dir / f"{name}.json"
        path.write_text(report_json.dumps(report) + "\n", encoding="utf-8")
        _print_ratios(name, report)
        print(f"   ({elapsed:.0f} s; {path})", flush=True)
        summary[name] = report.get("ratios", {})
    return summary


def describe(fn: Callable[..., Any]) -> str:
    """The first line of a benchmark's docstring, or "(no description)"."""
    lines = (fn.__doc__ or "").strip().splitlines()
    return lines[0] if lines else "(no description)"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        for name, fn in BENCHMARKS.items():
            print(f"{name:<14} {describe(fn)}")
        return 0
    names = _selected(args.only)
    work = fresh_dir(args.work_dir)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"starting Kafka and Redis under {work} ...", flush=True)
    services = Services(
        work / "services",
        bootstrap=args.bootstrap_servers,
        redis_url=args.redis_url,
        fast_start=False,
    )
    procs = ProcessGroup(work / "logs")
    ctx = Context(args.repository, work, args.out_dir, services, procs, args.quick)
    try:
        with services:
            summary = run_load(_run_all(ctx, names), args.loop)
    finally:
        procs.stop_all()
    summary_path = args.out_dir / "summary.json"
    doc = {"environment": environment(), "quick": args.quick, "notes": ctx.notes, **summary}
    summary_path.write_text(report_json.dumps(doc) + "\n", encoding="utf-8")
    print(f"wrote {summary_path}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any("error" in v for v in summary.values() if isinstance(v, dict)) else 0
