"""The one child-process class of the stack, and a group that stops its members together.

Every process the stack starts (a Kafka node, redis-server, a Plaza worker or gateway, a
benchmark's baseline server) is a :class:`ChildProcess`:

- its output is appended to a log file, which is opened for ``Popen`` and closed right
  after (the child keeps its own descriptor), so no handle leaks however often it restarts;
- it runs in a session of its own, so a Ctrl-C on the terminal reaches only the parent,
  which then stops its children in order;
- it asks the kernel for a parent-death signal (``PR_SET_PDEATHSIG``, through util-linux's
  ``setpriv --pdeathsig`` where it exists, else a ``preexec_fn``), so a parent killed with
  -9 leaves no broker, server or worker behind;
- it is stopped by pid: SIGTERM, then SIGKILL once a grace period has passed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Self, TypeVar

from plaza.stack.errors import ServiceError

_PR_SET_PDEATHSIG = 1
try:
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: children may outlive a parent killed with -9
    _prctl = None

_SETPRIV = shutil.which("setpriv") if sys.platform == "linux" else None
"""util-linux's setpriv sets the parent-death signal and execs the command. Preferred to a
``preexec_fn``: Python code run in a child forked from a threaded parent (gRPC, aiokafka,
ONNX Runtime threads) can deadlock on a lock another thread held at fork time."""

STOP_TIMEOUT_S = 30.0
"""Default grace period between SIGTERM and SIGKILL."""


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn``: the kernel SIGTERMs the child when the starting thread exits.

    The signal follows the *thread* that called Popen, so start long-lived children from a
    long-lived thread (the main thread, or the test's event-loop thread).
    """

    def preexec() -> None:
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class ChildProcess:
    """One child process: started, watched, stopped or killed by pid, output in a log file.

    ``crashed`` is true only for an exit nobody asked for: a process ended by
    :meth:`terminate`, :meth:`stop` or :meth:`kill` has not crashed.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_file: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_file = log_file
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None
        self._ended_by_us = False

    # -- state --
    @property
    def alive(self) -> bool:
        """Started and not exited yet."""
        return self._popen is not None and self._popen.poll() is None

    @property
    def pid(self) -> int | None:
        """The pid while alive, else None."""
        return self._popen.pid if self._popen is not None and self.alive else None

    @property
    def exit_code(self) -> int | None:
        """The exit status once it has exited (negative: the signal that ended it)."""
        return None if self._popen is None else self._popen.poll()

    @property
    def crashed(self) -> bool:
        """Started, exited, and not stopped or killed by us."""
        return self.exit_code is not None and not self._ended_by_us

    def check(self) -> None:
        """Raise :class:`ServiceError` with the log's tail if the process crashed."""
        if self.crashed:
            raise ServiceError(f"{self.name} exited with code {self.exit_code}\n{self.tail()}")

    # -- lifecycle --
    def start(self) -> Self:
        """Start the process (a no-op while it is alive)."""
        if self.alive:
            return self
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        argv, preexec = self.argv, None
        if _SETPRIV is not None:  # no Python runs between fork and exec: safe with threads
            argv = [_SETPRIV, "--pdeathsig", "TERM", "--", *self.argv]
        else:
            preexec = _die_with_parent(os.getpid())
        with self.log_file.open("ab") as log:  # the child has its own copy once started
            self._popen = subprocess.Popen(
                argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches only the parent: it stops us in order
                preexec_fn=preexec,
            )
        self._ended_by_us = False
        return self

    def terminate(self) -> None:
        """Send SIGTERM (a graceful shutdown) without waiting."""
        self._signal(signal.SIGTERM)

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Wait for the exit, SIGKILL after ``timeout``; True when it exited on its own."""
        if self._popen is None:
            return True
        try:
            self._popen.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            self.kill()
            return False
        return True

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """SIGTERM, then SIGKILL after ``timeout``; True when it stopped gracefully."""
        self.terminate()
        return self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash: no drain, no flush, no goodbye. Waits for the exit."""
        self._signal(signal.SIGKILL)
        if self._popen is not None:
            self._popen.wait()

    def wait_exit(self) -> int:
        """Wait (without a limit) until a started one-shot command exits; its exit status."""
        if self._popen is None:
            raise ServiceError(f"{self.name} was never started")
        return self._popen.wait()

    def _signal(self, sig: signal.Signals) -> None:
        if self._popen is None:
            return
        self._ended_by_us = True
        if self._popen.poll() is None:  # not reaped yet, so the pid is still ours
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._popen.pid, sig)

    # -- logs --
    def log_text(self) -> str:
        """Everything in its log file ('' while there is none)."""
        return read_log(self.log_file)

    def tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines of its log, under a header naming the file."""
        return tail_file(self.log_file, lines)


def read_log(path: Path) -> str:
    """A log file's text ('' while there is none)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def tail_file(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file, under a header naming it."""
    text = "\n".join(read_log(path).splitlines()[-lines:])
    return f"--- {path} (last {lines} lines)\n{text}"


P = TypeVar("P", bound=ChildProcess)


class ProcessGroup:
    """Child processes started together (one test, one benchmark, one ``plaza up``).

    :meth:`check` fails as soon as one of them crashed; :meth:`stop_all` ends them all,
    the last started first. Members stay listed after they stopped (their logs are still
    wanted when a test fails); stopping one twice is harmless. Logs go to
    ``log_dir/<name>.log``.
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[ChildProcess] = []

    def log_file(self, name: str) -> Path:
        """Where the member called ``name`` logs."""
        return self.log_dir / f"{name}.log"

    def start(self, proc: P) -> P:
        """Start ``proc`` as a member of this group."""
        self.started.append(proc.start())
        return proc

    def spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> ChildProcess:
        """Start ``python <argv>`` (this interpreter) as a member called ``name``."""
        return self.start(ChildProcess(name, [sys.executable, *argv], self.log_file(name), env=env))

    def check(self) -> None:
        """Raise :class:`ServiceError` (with its log's tail) if a member crashed."""
        for proc in self.started:
            proc.check()

    def stop(self, procs: Iterable[ChildProcess], timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM ``procs`` all at once, then wait; SIGKILL what outlives ``timeout``."""
        procs = list(procs)
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + timeout  # shutdowns overlap: one grace period for all
        for proc in procs:
            proc.wait(deadline - time.monotonic())

    def stop_all(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every member, the last started first."""
        self.stop(list(reversed(self.started)), timeout)

    def tails(self, lines: int = 15) -> str:
        """The log tails of every member, for a failure message."""
        return "\n".join(proc.tail(lines) for proc in self.started)
