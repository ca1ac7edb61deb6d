"""plaza.gc_tuning, in a fresh interpreter (it changes interpreter-wide state)."""

from __future__ import annotations

import json
import subprocess
import sys

from plaza.gc_tuning import GC_THRESHOLDS

PROBE = """
import gc, json
from plaza import gc_tuning
before = gc.get_threshold()
gc_tuning.tune()
gc_tuning.freeze_startup()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_a_serving_process_sets_the_thresholds_and_freezes_what_start_up_made() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], check=True, capture_output=True, text=True, timeout=60
    )
    seen = json.loads(out.stdout)
    assert tuple(seen["before"]) != GC_THRESHOLDS  # Python's defaults until a process tunes
    assert tuple(seen["after"]) == GC_THRESHOLDS
    assert seen["frozen"] > 1000  # the imported modules' objects, at least
