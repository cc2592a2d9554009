"""Every Python block in README.md runs as written, and every docstring example
(``>>>``) of the public API prints what it shows.

Each block runs on its own, in a fresh namespace, so a block that leans on a
name another block defined (or on a name nobody defined) fails here. Blocks are
named by the README heading above them and their first line. A block that imports
a package which is not installed (torch and transformers for fastpe.hf: the "hf"
extra) is skipped, naming it.
"""

from __future__ import annotations

import ast
import doctest
import importlib.util
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import fastpe
import fastpe.hf

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


def _missing_packages(code: str) -> list[str]:
    """The top-level packages that code imports and this environment lacks."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


def test_readme_has_python_examples():
    if not README.is_file():
        pytest.skip("README.md is not beside the tests (an installed-wheel run)")
    assert len(BLOCKS) >= 4, "README.md should show an example for every family"


@pytest.mark.parametrize("code", [code for _, code in BLOCKS],
                         ids=[name for name, _ in BLOCKS])
def test_readme_example_runs(code, tmp_path, monkeypatch):
    missing = _missing_packages(code)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}, not installed")
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})


def _documented() -> dict[str, object]:
    """The public functions and classes, with the methods and properties of each class."""
    found: dict[str, object] = {}
    for module, prefix in ((fastpe, ""), (fastpe.hf, "hf.")):
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isroutine(obj) or inspect.isclass(obj)):
                continue
            found[prefix + name] = obj
            if inspect.isclass(obj):
                for attr, raw in vars(obj).items():
                    if (not attr.startswith("_") or attr == "__call__") and (
                            inspect.isroutine(raw) or isinstance(raw, (property, classmethod,
                                                                        staticmethod))):
                        found[f"{prefix}{name}.{attr}"] = getattr(obj, attr)
    return found


def test_docstring_examples_print_what_they_show():
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    ran = 0
    for name, obj in _documented().items():
        for test in finder.find(obj, name, globs={"np": np, "fastpe": fastpe}):
            ran += runner.run(test, out=report.append).attempted
    assert report == [], "".join(report)
    assert ran >= 15, f"only {ran} docstring examples found"
