"""Every Python block in README.md runs as written.

Each block runs on its own, in a fresh namespace, so a block that leans on a
name another block defined (or on a name nobody defined) fails here. Blocks are
named by the README heading above them and their first line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

_FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _python_blocks() -> list[tuple[str, str]]:
    if not README.is_file():  # tests run from an installed wheel, outside the checkout
        return []
    text = README.read_text(encoding="utf-8")
    blocks = []
    for match in _FENCE.finditer(text):
        headings = re.findall(r"^#+ (.+)$", text[:match.start()], re.MULTILINE)
        section = headings[-1] if headings else "top"
        # pad with blank lines so a traceback's line numbers are README.md's own
        line = text.count("\n", 0, match.start(1))
        blocks.append((f"{section}: {match.group(1).splitlines()[0]}",
                       "\n" * line + match.group(1)))
    return blocks


BLOCKS = _python_blocks()


def test_readme_has_python_examples():
    if not README.is_file():
        pytest.skip("README.md is not beside the tests (an installed-wheel run)")
    assert len(BLOCKS) >= 4, "README.md should show an example for every family"


@pytest.mark.parametrize("code", [code for _, code in BLOCKS],
                         ids=[name for name, _ in BLOCKS])
def test_readme_example_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
