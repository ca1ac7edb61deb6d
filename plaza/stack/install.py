"""Installing what the services run on: Kafka's jars (mvn), redis-server (apt-get), Java."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from plaza.stack.errors import ServiceError

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_POM = Path("deploy/kafka/pom.xml")
KAFKA_LOG4J2 = Path("deploy/kafka/log4j2.xml")
KAFKA_LIBS = Path(".cache/kafka/libs")
_LIBS_STAMP = ".complete"  # in the libs folder; the JVM's 'libs/*' classpath only takes jars


def ensure_kafka_jars(repo_root: Path | str = REPO_ROOT) -> Path:
    """Return the folder of Kafka's jars, fetching them with ``mvn`` if missing or stale.

    The folder (``.cache/kafka/libs``) carries a stamp with the pom's hash, so a changed
    pom (a new Kafka version) fetches again, and an interrupted fetch never looks complete:
    jars land in a temporary folder that is renamed into place only when mvn succeeded.
    """
    root = Path(repo_root).resolve()
    pom = root / KAFKA_POM
    libs = root / KAFKA_LIBS
    if not pom.is_file():
        raise ServiceError(f"{pom} not found: is {root} the Plaza repository?")
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    if _stamp_matches(libs, digest):
        return libs
    libs.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(libs.parent / ".fetch.lock"):
        if not _stamp_matches(libs, digest):  # another process may have fetched meanwhile
            _fetch_jars(pom, libs, digest)
    return libs


def _stamp_matches(libs: Path, digest: str) -> bool:
    stamp = libs / _LIBS_STAMP
    return stamp.is_file() and stamp.read_text().strip() == digest


def _fetch_jars(pom: Path, libs: Path, digest: str) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ServiceError("mvn not found; install Maven (apt-get install -y maven) and Java 17")
    tmp = libs.with_name(f"{libs.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies"]
    cmd += [f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not any(tmp.glob("kafka_2.13-*.jar")):
        shutil.rmtree(tmp, ignore_errors=True)
        output = (done.stdout + done.stderr)[-3000:]
        raise ServiceError(f"fetching Kafka jars failed ({' '.join(cmd)}):\n{output}")
    (tmp / _LIBS_STAMP).write_text(digest + "\n")
    shutil.rmtree(libs, ignore_errors=True)
    tmp.rename(libs)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_redis_server() -> str:
    """Return the path of ``redis-server``, installing Debian's package if it is missing."""
    found = _find_redis_server()
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None:
        raise ServiceError("redis-server not found and there is no apt-get to install it")
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in (
        ["update", "-q"],
        ["install", "-y", "-q", "--no-install-recommends", "redis-server"],
    ):
        done = subprocess.run([*prefix, apt, *args], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-3000:]
            raise ServiceError(f"apt-get {' '.join(args)} failed:\n{output}")
    found = _find_redis_server()
    if not found:
        raise ServiceError("apt-get installed redis-server but no redis-server binary was found")
    return found


def _find_redis_server() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    for candidate in ("/usr/bin/redis-server", "/usr/local/bin/redis-server"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def find_java() -> str:
    """The ``java`` to run Kafka with: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home, "bin", "java"), os.X_OK):
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if found is None:
        raise ServiceError(
            "java not found; Kafka 4 needs Java 17+ (apt-get install openjdk-17-jre)"
        )
    return found
