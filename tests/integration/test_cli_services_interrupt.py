"""``plaza services up`` interrupted by Ctrl-C while Kafka starts: everything already
started is stopped, one line says so, and the exit status is 130 (it used to go on until
Kafka was ready, then print "services up" and exit 0). Runs a real Kafka JVM for the few
seconds until the signal, on ports of its own.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from plaza.stack import wait_for
from tests.unit.test_cli_services_checks import ROOT, free_ports


async def test_ctrl_c_while_kafka_starts_stops_everything_and_exits_130(tmp_path: Path) -> None:
    data_dir, out = tmp_path / "data", tmp_path / "out.log"
    argv = ["-m", "plaza.cli.main", "services", "up", "--data-dir", str(data_dir), *free_ports()]
    with out.open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *argv, cwd=ROOT, stdout=sink, stderr=sink
        )
    try:
        broker_log = data_dir / "kafka" / "node-0" / "stdout.log"  # made as the JVM starts
        await wait_for(broker_log.exists, 90, "the Kafka JVM to start", out.read_text)
        proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), 90)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = out.read_text()
    assert code == 130, text
    assert "interrupted" in text and "services up" not in text
    assert "Traceback" not in text
