"""plaza.stack without services: the process class, the deployment's environment, waits.

The child processes here are tiny ``python -c`` programs; nothing needs Kafka or Redis.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest

from plaza.stack import ChildProcess, Deployment, ProcessGroup, ServiceError, WaitTimeout, wait_for

# Says it is up, then waits for a signal; on SIGTERM it prints "bye" and exits 0.
SERVER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (print('bye', flush=True), sys.exit(0)))\n"
    "print('up', flush=True)\n"
    "while True: signal.pause()\n"
)
STUBBORN = (
    "import signal\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('up', flush=True)\n"
    "while True: signal.pause()\n"
)


def python(tmp_path: Path, name: str, code: str) -> ChildProcess:
    return ChildProcess(name, [sys.executable, "-c", code], tmp_path / f"{name}.log")


async def started(proc: ChildProcess) -> ChildProcess:
    proc.start()
    await wait_for(lambda: "up" in proc.log_text(), 30, f"{proc.name} to start")
    return proc


def open_files() -> set[str]:
    """What this process has open (other tests' sockets come and go: compare paths)."""
    paths = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            paths.add(os.readlink(f"/proc/self/fd/{fd}"))
    return paths


async def test_stop_is_sigterm_and_the_log_file_is_not_left_open(tmp_path: Path) -> None:
    proc = await started(python(tmp_path, "server", SERVER))
    assert proc.alive and proc.pid is not None
    assert str(proc.log_file) not in open_files()  # the log handle was closed after Popen
    assert proc.stop(timeout=20) is True
    assert (proc.alive, proc.exit_code, proc.crashed) == (False, 0, False)
    assert "bye" in proc.tail(5)


async def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    proc = await started(python(tmp_path, "stubborn", STUBBORN))
    assert proc.stop(timeout=0.5) is False
    assert proc.exit_code == -signal.SIGKILL and not proc.crashed


async def test_an_exit_nobody_asked_for_is_a_crash(tmp_path: Path) -> None:
    proc = python(tmp_path, "crasher", "import sys; print('oops', flush=True); sys.exit(3)")
    group = ProcessGroup(tmp_path)
    group.start(proc)
    proc.wait_exit()
    assert proc.crashed and proc.exit_code == 3
    with pytest.raises(ServiceError, match="exited with code 3") as caught:
        group.check()
    assert "oops" in str(caught.value)


async def test_a_group_stops_every_member(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path)
    procs = [group.start(await started(python(tmp_path, f"s{i}", SERVER))) for i in range(2)]
    killed = group.start(await started(python(tmp_path, "victim", SERVER)))
    killed.kill()
    group.check()  # killed on purpose: not a crash
    group.stop_all(timeout=20)
    assert [p.exit_code for p in procs] == [0, 0]
    assert killed.exit_code == -signal.SIGKILL


def test_deployment_env_drops_the_callers_plaza_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PLAZA_WORKER__MAX_PENDING", "7")
    monkeypatch.setenv("PLAZA_KAFKA__TOPIC_PREFIX", "other.")
    monkeypatch.setenv("UNRELATED_VARIABLE", "kept")
    dep = Deployment("127.0.0.1:1", "redis://127.0.0.1:2/0", tmp_path, "t1", partitions=2)
    env = dep.env(PLAZA_WORKER__WORKER_ID="w1")
    assert "PLAZA_WORKER__MAX_PENDING" not in env
    assert env["PLAZA_KAFKA__TOPIC_PREFIX"] == "t1."
    assert env["PLAZA_REDIS__KEY_PREFIX"] == "t1:"
    assert env["PLAZA_KAFKA__PARTITIONS"] == "2"
    assert env["PLAZA_WORKER__WORKER_ID"] == "w1"
    assert env["UNRELATED_VARIABLE"] == "kept"
    assert "PLAZA_KAFKA__MIN_INSYNC_REPLICAS" not in env  # None: Plaza's default


def test_deployment_settings_say_what_its_env_says(tmp_path: Path) -> None:
    dep = Deployment(
        "127.0.0.1:1",
        "redis://127.0.0.1:2/0",
        tmp_path,
        "t2",
        stream_maxlen=99,
        model_config_name="h100",
    )
    settings = dep.settings()
    env = dep.env()
    assert settings.model_config_name == env["PLAZA_MODEL_CONFIG_NAME"] == "h100"
    assert settings.kafka.topic_prefix == env["PLAZA_KAFKA__TOPIC_PREFIX"]
    assert settings.redis.key_prefix == env["PLAZA_REDIS__KEY_PREFIX"]
    assert str(settings.redis.stream_maxlen) == env["PLAZA_REDIS__STREAM_MAXLEN"]
    assert settings.names == dep.names


async def test_wait_for_names_what_it_waited_for() -> None:
    with pytest.raises(WaitTimeout, match="the impossible") as caught:
        await wait_for(lambda: False, 0.05, "the impossible", lambda: "some detail")
    assert "some detail" in str(caught.value)
    assert isinstance(caught.value, TimeoutError)


def test_free_ports_come_from_below_the_ephemeral_range() -> None:
    """A block no outgoing connection can take while its service starts; a preferred block
    that is free is used as it is."""
    from plaza.stack.ports import LOWEST, ephemeral_low, free_port, ports_free

    low = ephemeral_low()
    for count in (1, 6):
        start = free_port(count=count)
        assert ports_free(start, count)
        if low - count > LOWEST:
            assert start >= LOWEST and start + count <= low
    assert free_port(preferred=start, count=6) == start
