"""A Python backend model completes its own config: Triton's ``auto_complete_config``.

When the newest served version's ``model.py`` defines
``TritonPythonModel.auto_complete_config`` (a staticmethod), it is called with the config as
written (``pb_utils.ModelConfig``: an empty one when the folder has no config.pbtxt), in
Triton's JSON form, every field printed even at its default (so a written ``optional: false``
or ``decoupled: false`` is seen, and a hook's contrary call raises, as in Triton), and what
it returns is the model's config, checked as a written one is. As in Triton it runs whether
or not the config names tensors.

The processes that read the repository (gateway, workers, hosts) never import model.py: the
hook runs in a short-lived child, ``python -m plaza.workers.backends.python_autocomplete``,
which gets the model file and the written config as JSON on stdin and answers the completed
config, or the error, as JSON on stdout; it is killed past ``TIMEOUT_S``. A completed
config is remembered per model file (path, size, modification time) and written config, so
a repository poll starts no process; a failure is not (the hook's own, or a child that did
not start, died or overran): the next read runs the hook again, as Triton does on each load,
so fixing a module model.py imports is enough. A model.py that does not contain the text
``auto_complete_config`` starts none at all. Whatever fails (the hook raises, refuses a
tensor, returns something else than the ModelConfig, the process dies or overruns) is a
``bad_config`` naming the model and the cause.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

import plaza
from plaza.errors import ConfigError
from plaza.modelconfig import config_to_json

log = logging.getLogger(__name__)

CHILD_MODULE = "plaza.workers.backends.python_autocomplete"
HOOK = "auto_complete_config"
TIMEOUT_S = 30.0
"""How long the child may take, model.py's import included, before it is killed."""
STDERR_TAIL = 1000
"""How much of a dead child's stderr its error quotes (characters, the last ones)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the child answered."""

    config: str = ""
    """The completed config (Triton's JSON form); "": the hook left it as written."""
    error: str = ""
    """Why the hook failed; "" when it did not (only then is the outcome remembered)."""


def complete(config: mc.ModelConfig, path: Path, source: str) -> None:
    """Replace ``config`` by what model.py's hook (at ``path``) makes of it; nothing when
    the file has no hook. ConfigError naming the model and ``source`` on any failure."""
    name = config.name or path.parent.parent.name
    written = mc.ModelConfig()
    written.CopyFrom(config)
    written.name = name
    # Triton's JSON form, defaults printed: the hook sees a written `decoupled: false`
    text = json.dumps(config_to_json(written), sort_keys=True)
    try:
        stat = path.stat()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read {path}: {exc.strerror}", file=source) from exc
    outcome = _outcome(str(path), stat.st_size, stat.st_mtime_ns, text)
    where = f"{source}: {HOOK} of model {name!r} ({path})"
    if outcome.error:
        raise ConfigError(f"{where} failed: {outcome.error}", file=source)
    if outcome.config:
        completed = mc.ModelConfig()
        try:
            json_format.Parse(outcome.config, completed)
        except json_format.ParseError as exc:
            raise ConfigError(f"{where} made a config Plaza cannot read: {exc}") from exc
        config.CopyFrom(completed)


REMEMBERED = 256
"""Outcomes remembered per process, the least recently read forgotten first."""
_remembered: OrderedDict[tuple[str, int, int, str], Outcome] = OrderedDict()
_remembered_lock = threading.Lock()  # reads run on threads (the gateway's, the SDK's)


def _outcome(path: str, size: int, mtime_ns: int, written: str) -> Outcome:
    """The hook's answer, once per model file and written config (the key's size and time
    only tell a changed file apart) when it completed the config; a failure is asked again
    on the next read (its cause may lie outside model.py: a module it imports)."""
    key = (path, size, mtime_ns, written)
    with _remembered_lock:
        known = _remembered.get(key)
        if known is not None:
            _remembered.move_to_end(key)
            return known
    outcome = _ask(path, written)
    if not outcome.error:
        with _remembered_lock:
            _remembered[key] = outcome
            while len(_remembered) > REMEMBERED:
                _remembered.popitem(last=False)
    return outcome


def _ask(path: str, written: str) -> Outcome:
    """What model.py at ``path`` makes of the ``written`` config (nothing: no hook)."""
    try:
        source = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return Outcome(error=f"cannot read it: {exc.strerror}")
    if HOOK not in source:
        return Outcome()
    return run_child(path, written)


def run_child(path: str, written: str) -> Outcome:
    """Run the hook of the model file ``path`` on the ``written`` config (JSON) in a child
    process of its own (the test seam: a fake takes its place)."""
    config = json.loads(written)
    request = json.dumps({"model_file": path, "config": config, "timeout_s": TIMEOUT_S})
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_child_env(),
            start_new_session=True,  # a terminal's ^C is for this process; the kill takes all
        )
    except OSError as exc:
        return Outcome(error=f"its process did not start: {exc}")
    try:
        out, err = child.communicate(request.encode(), timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # with whatever model.py started
        child.communicate()
        return Outcome(error=f"it ran past {TIMEOUT_S:g} s and was killed")
    return _answer(path, child.returncode, out, err.decode(errors="replace"))


def _answer(path: str, status: int, out: bytes, err: str) -> Outcome:
    if err:
        log.info("%s: %s wrote:\n%s", path, HOOK, err.rstrip())
    try:
        answer = json.loads(out) if status == 0 else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        tail = err[-STDERR_TAIL:].strip()
        said = f": {tail}" if tail else ""
        return Outcome(error=f"its process {how} without an answer{said}")
    if answer.get("error"):
        if answer.get("traceback"):
            log.warning("%s: %s failed:\n%s", path, HOOK, answer["traceback"].rstrip())
        return Outcome(error=str(answer["error"]))
    config = answer.get("config")
    return Outcome(config=json.dumps(config) if config is not None else "")


def _child_env() -> dict[str, str]:
    """This process's environment, with this very Plaza importable (a checkout's, not only
    an installed one)."""
    env = dict(os.environ)
    root = str(Path(plaza.__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env
