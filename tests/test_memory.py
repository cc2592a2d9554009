"""Memory: a million small calls keep the resident set flat (bench/leak_check.py).

The full check is slow (a million calls, about 10 s) and runs only when asked for:

    pytest -m slow tests/test_memory.py        # or FASTPE_SLOW=1 pytest tests/test_memory.py
    python bench/leak_check.py                 # the same check as a script

The default suite runs the script briefly, so that it keeps working.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import COMPILED, PACKAGE_ROOT, TREE_ROOT, UNDER_ASAN, clean_env

SCRIPT = TREE_ROOT / "bench" / "leak_check.py"

pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="bench/ is not in this tree")


def leak_check(*args: str, timeout: float = 600) -> dict:
    """Run bench/leak_check.py in a fresh interpreter; its JSON report."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", *args], env=clean_env(),
                          capture_output=True, text=True, timeout=timeout,
                          cwd=str(PACKAGE_ROOT))
    lines = proc.stdout.strip().splitlines()
    assert lines, f"leak_check.py printed nothing (rc {proc.returncode}): {proc.stderr[-2000:]}"
    report = json.loads(lines[-1])
    assert proc.returncode == (0 if report["ok"] else 1), proc.stderr[-2000:]
    return report



def test_leak_check_runs():
    """The script itself, briefly: it runs every kind of call and reports (too few calls
    to judge growth)."""
    report = leak_check("--calls", "20000", "--warmup", "2000", "--max-growth-mb", "1e6")
    assert report["ok"] and report["calls"] == 20000 and report["kinds"] >= 20
    assert len(report["samples_mb"]) == 10


@pytest.mark.slow
@pytest.mark.skipif(UNDER_ASAN, reason="RSS under AddressSanitizer includes its quarantine")
@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
def test_a_million_calls_keep_rss_flat():
    report = leak_check("--calls", "1000000", "--max-growth-mb", "2")
    assert report["ok"], (f"RSS grew by {report['growth_mb']} MB over {report['calls']} calls "
                          f"(samples {report['samples_mb']} MB, before "
                          f"{report['rss_before_mb']} MB)")
