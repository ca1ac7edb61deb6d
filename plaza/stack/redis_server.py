"""Debian's ``redis-server`` on this machine, with an explicit config and AOF on."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Literal, Self
from urllib.parse import quote

import redis.asyncio
import redis.exceptions

from plaza.stack.data_dir import prepare_data_dir
from plaza.stack.errors import ServiceError, ServiceOptionError
from plaza.stack.install import ensure_redis_server
from plaza.stack.managed import ManagedService
from plaza.stack.ports import HOST, require_free
from plaza.stack.process import ChildProcess, tail_file
from plaza.stack.waiting import wait_for

REDIS_READY_TIMEOUT_S = 15.0
_CONF_UNSAFE = re.compile(r'["\\\x00-\x1f\x7f]')
"""What a double-quoted redis.conf value cannot hold as written: a quote, a backslash (an
escape there), a newline or any other control character."""


def check_password(password: str | None) -> None:
    """:class:`ServiceOptionError` for a password redis.conf's ``requirepass`` cannot hold."""
    if password and _CONF_UNSAFE.search(password):
        raise ServiceOptionError(
            "Redis password: a double quote, a backslash, a newline or another control "
            "character cannot be written to redis.conf; choose another password"
        )


class RedisServer(ManagedService):
    """Debian's ``redis-server`` on 127.0.0.1 with an explicit config, AOF on, no RDB.

    Data and the log (``redis.log``) live in ``data_dir``, so :meth:`restart` (and
    :meth:`kill` then :meth:`start`) keeps what the append-only file holds. With
    ``appendfsync="always"`` every acknowledged write survives even a SIGKILL.
    Use as a context manager (start + wait_ready, then stop) or call the methods.
    """

    OWN_ENTRIES: ClassVar[tuple[str, ...]] = (
        r"redis\.conf", r"redis\.log", r"stdout\.log", r"appendonlydir", r"dump\.rdb",
        r"temp-.+",
    )  # fmt: skip
    """What a Redis data dir holds (full-match patterns): config, logs, AOF, a SAVE's RDB
    and Redis's temporary files."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int = 6379,
        password: str | None = None,
        appendfsync: Literal["always", "everysec", "no"] = "everysec",
        binary: str | None = None,
    ) -> None:
        check_password(password)
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.password = password
        self.appendfsync = appendfsync
        self._binary = binary
        self._proc: ChildProcess | None = None

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:port/0``, the password percent-encoded."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "redis.conf"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.alive

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> Self:
        """Write the config and start redis-server (no-op if running)."""
        if self.running:
            return self
        if self._binary is None:
            self._binary = ensure_redis_server()
        require_free([self.port], "Redis")
        prepare_data_dir(self.data_dir, "Redis data dir")
        self.config_file.write_text(self._config())
        argv = [self._binary, str(self.config_file)]
        proc = ChildProcess("redis", argv, self.data_dir / "stdout.log", cwd=self.data_dir)
        self._proc = proc.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (Redis fsyncs the AOF and exits); SIGKILL after ``timeout``."""
        if self._proc is not None:
            self._proc.stop(timeout)
            self._proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash: only what the AOF had fsynced survives."""
        if self._proc is not None:
            self._proc.kill()
            self._proc = None

    def restart(self, *, hard: bool = False, timeout: float = 15.0) -> None:
        """Stop (or with ``hard``, SIGKILL) and start again on the same data dir."""
        if hard:
            self.kill()
        else:
            self.stop(timeout)
        self.start()

    async def wait_ready_async(self, timeout: float = REDIS_READY_TIMEOUT_S) -> None:  # noqa: ASYNC109
        """Wait until PING succeeds (Redis answers LOADING while it replays the AOF)."""
        client = redis.asyncio.Redis(
            host=HOST, port=self.port, password=self.password,
            socket_connect_timeout=0.5, socket_timeout=2.0,
        )  # fmt: skip

        async def pong() -> bool:
            self.check()
            try:
                return bool(await client.ping())
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                return False

        try:
            await wait_for(
                pong,
                timeout,
                f"Redis to answer PING (read {self.log_file})",
                self._tail,
                poll_s=0.05,
            )
        finally:
            await client.aclose()

    def _config(self) -> str:
        lines = [
            f"bind {HOST}",
            f"port {self.port}",
            "protected-mode no",  # bound to loopback only; a password is optional
            "daemonize no",
            "supervised no",
            f'dir "{self.data_dir}"',
            f'logfile "{self.log_file}"',
            "loglevel notice",
            'save ""',
            "appendonly yes",
            f"appendfsync {self.appendfsync}",
            'appenddirname "appendonlydir"',
            "databases 16",
        ]
        if self.password:
            lines.append(f'requirepass "{self.password}"')
        return "\n".join(lines) + "\n"

    def _tail(self) -> str:
        own = "\n" + self._proc.tail(10) if self._proc is not None else ""
        return tail_file(self.log_file) + own

    def check(self) -> None:
        """:class:`ServiceError` with its exit code and logs' tails if it exited unasked."""
        if self._proc is not None and self._proc.crashed:
            code = self._proc.exit_code
            raise ServiceError(f"redis-server exited with code {code}\n{self._tail()}")
