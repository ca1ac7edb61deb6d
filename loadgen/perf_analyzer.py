"""Triton's perf_analyzer, run as a new user would run it: HTTP JSON (or gRPC), sync calls.

perf_analyzer is the C++ binary in the ``tritonclient==2.51.0`` wheel's ``bin/`` (later
wheels need a newer glibc than Debian 12's). ``make bench-tools`` installs that wheel and
``nvidia-cuda-runtime-cu12`` (perf_analyzer links ``libcudart.so.12`` even for CPU-only
servers) under ``.cache/bench-tools`` and Debian's ``libb64-0d`` with apt-get. The binary is
found at ``PLAZA_PERF_ANALYZER`` or there.

Inputs go through ``--input-data`` (a JSON file made from loadgen's input pool): the
random FP32 bytes perf_analyzer makes on its own include NaN. Each run is bounded in time:
``--max-trials`` windows of ``--measurement-interval`` with the stability check off (the
machine is shared; a check that never passes would only retry), and a subprocess timeout.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from plaza.loadgen.inputs import InputSet

TOOLS_DIR = Path(__file__).resolve().parents[1] / ".cache" / "bench-tools"
"""Where ``make bench-tools`` installs perf_analyzer's wheel (``pip install --target``)."""
BINARY_ENV = "PLAZA_PERF_ANALYZER"
WINDOWS = 3
"""Measurement windows per run; perf_analyzer reports over them together."""
EXIT_GRACE_S = 5.0
"""How long perf_analyzer may take to exit once it wrote its CSV before it is killed."""
POLL_S = 0.05
NO_STABILITY_CHECK = 999
"""--stability-percentage that every run passes: ``WINDOWS`` windows, then the report."""

Protocol = Literal["http", "grpc"]
SharedMemory = Literal["none", "system"]
"""perf_analyzer's --shared-memory: tensors in the bodies, or in system shared memory."""


class PerfAnalyzerMissing(RuntimeError):
    """perf_analyzer (or a library it needs) is not installed; ``make bench-tools``."""


@dataclass(frozen=True, slots=True)
class PerfResult:
    """One perf_analyzer run: throughput and client-side latency percentiles."""

    concurrency: int
    throughput: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    columns: dict[str, str]
    """Every column of perf_analyzer's CSV row, as it wrote them (microseconds)."""
    cpu_s: float = 0.0
    """perf_analyzer's own CPU (user + system seconds) over its whole run, warm-up and
    metadata requests included: the client's share of the machine."""
    lingered: bool = False
    """It wrote its CSV, then did not exit within ``EXIT_GRACE_S`` and was killed."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "throughput": round(self.throughput, 1),
            "p50_ms": round(self.p50_ms, 3),
            "p90_ms": round(self.p90_ms, 3),
            "p95_ms": round(self.p95_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "client_cpu_s": round(self.cpu_s, 3),
            "lingered": self.lingered,
            "csv": self.columns,
        }


def binary_path() -> Path:
    """The perf_analyzer binary; PerfAnalyzerMissing when there is none."""
    path = Path(os.environ.get(BINARY_ENV) or TOOLS_DIR / "bin" / "perf_analyzer")
    if not path.is_file():
        raise PerfAnalyzerMissing(f"no perf_analyzer at {path}: run `make bench-tools`")
    return path


def tool_env() -> dict[str, str]:
    """The environment perf_analyzer runs in: libcudart.so.12 from the wheel on the path."""
    env = dict(os.environ)
    cudart = (TOOLS_DIR / "nvidia" / "cuda_runtime" / "lib").resolve()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(cudart), env.get("LD_LIBRARY_PATH", "")) if p
    )
    return env


def check_installed() -> str:
    """perf_analyzer's version line; PerfAnalyzerMissing naming what is missing."""
    path = binary_path()
    proc = subprocess.run(
        [str(path), "--version"], env=tool_env(), capture_output=True, text=True, timeout=30
    )
    if proc.returncode != 0:
        raise PerfAnalyzerMissing(
            f"{path} does not start (libb64-0d or libcudart.so.12 missing? run `make "
            f"bench-tools`): {(proc.stderr or proc.stdout).strip()[-300:]}"
        )
    return (proc.stdout or proc.stderr).strip()


def write_input_data(pool: Sequence[InputSet], path: Path) -> Path:
    """perf_analyzer's --input-data JSON: each pool entry one step, without the batch dim
    (perf_analyzer adds it: batch size 1)."""
    steps = []
    for inputs in pool:
        step = {}
        for name, array in inputs.items():
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise ValueError(f"input {name} holds NaN or inf")
            step[name] = {"content": array.reshape(-1).tolist(), "shape": list(array.shape[1:])}
        steps.append(step)
    path.write_text(json.dumps({"data": steps}), encoding="utf-8")
    return path


def command(
    model: str,
    address: str,
    protocol: Protocol,
    concurrency: int,
    input_data: Path,
    csv_path: Path,
    interval_ms: int,
    shared_memory: SharedMemory = "none",
    sequence_length: int = 0,
) -> list[str]:
    """perf_analyzer's arguments: sync calls, JSON tensors over HTTP, bounded windows;
    ``shared_memory`` "system": the tensors in system shared memory that perf_analyzer
    creates and registers (the gateway needs ``gateway.allow_client_shm``);
    ``sequence_length`` > 0: a stateful model's sequences of that many requests, each
    concurrent client running one sequence at a time (perf_analyzer's sequence mode)."""
    argv = [
        str(binary_path()),
        "-m",
        model,
        "-u",
        address,
        "-i",
        protocol,
        "--concurrency-range",
        str(concurrency),
        "--measurement-interval",
        str(interval_ms),
        "--max-trials",
        str(WINDOWS),
        "--stability-percentage",
        str(NO_STABILITY_CHECK),
        "--input-data",
        str(input_data),
        "-f",
        str(csv_path),
    ]
    if protocol == "http":
        argv += ["--input-tensor-format", "json", "--output-tensor-format", "json"]
    if shared_memory != "none":
        argv += ["--shared-memory", shared_memory]
    if sequence_length > 0:
        argv += ["--sequence-length", str(sequence_length)]
    return argv


def run(
    model: str,
    address: str,
    protocol: Protocol,
    concurrency: int,
    input_data: Path,
    interval_ms: int = 2000,
    shared_memory: SharedMemory = "none",
    sequence_length: int = 0,
) -> PerfResult:
    """One perf_analyzer run at ``concurrency`` against ``address`` (host:port)."""
    with tempfile.TemporaryDirectory(prefix="plaza-pa-") as tmp:
        csv_path = Path(tmp) / "out.csv"
        argv = command(
            model,
            address,
            protocol,
            concurrency,
            input_data,
            csv_path,
            interval_ms,
            shared_memory,
            sequence_length,
        )
        # warm-up, windows, and perf_analyzer's own start and drain, with room to spare
        limit_s = 30 + (WINDOWS + 2) * interval_ms / 1000
        code, cpu_s, tail, lingered = _run_measured(argv, csv_path, limit_s)
        if not csv_path.exists() or (code != 0 and not lingered):
            why = f"was killed past {limit_s:.0f} s" if code < 0 else f"exited {code}"
            raise RuntimeError(f"perf_analyzer {why}: {tail}")
        result = parse_csv(csv_path.read_text(encoding="utf-8"))
        return replace(result, cpu_s=cpu_s, lingered=lingered)


def _run_measured(argv: list[str], csv_path: Path, limit_s: float) -> tuple[int, float, str, bool]:
    """Run ``argv`` to its end: its exit code, its own CPU seconds (``wait4``'s usage of
    that one child, whatever else this process runs meanwhile), the last lines it printed,
    and whether it lingered: it is killed past ``limit_s``, or ``EXIT_GRACE_S`` after it
    wrote ``csv_path`` (perf_analyzer 2.51 has been seen to hang on its way out, its
    measurement done and written)."""
    log = csv_path.with_suffix(".log")
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=tool_env(), stdout=out, stderr=subprocess.STDOUT)
    started, written, lingered = time.monotonic(), None, False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        now = time.monotonic()
        if written is None and csv_path.exists() and csv_path.stat().st_size > 0:
            written = now
        if now - started > limit_s or (written is not None and now - written > EXIT_GRACE_S):
            proc.kill()
            lingered = written is not None
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(POLL_S)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait
    tail = log.read_text(encoding="utf-8", errors="replace").strip()[-600:]
    return proc.returncode, usage.ru_utime + usage.ru_stime, tail, lingered


def parse_csv(text: str) -> PerfResult:
    """The first data row of perf_analyzer's ``-f`` CSV (latencies there are in us)."""
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise ValueError("perf_analyzer wrote no result row")
    row = rows[0]

    def ms(column: str) -> float:
        return float(row[column]) / 1000.0

    return PerfResult(
        concurrency=int(row["Concurrency"]),
        throughput=float(row["Inferences/Second"]),
        p50_ms=ms("p50 latency"),
        p90_ms=ms("p90 latency"),
        p95_ms=ms("p95 latency"),
        p99_ms=ms("p99 latency"),
        columns=dict(row),
    )
