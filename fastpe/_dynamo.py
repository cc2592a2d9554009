"""fastpe's code, opaque to torch.compile's frame tracer (TorchDynamo).

Dynamo traces the Python it meets, NumPy calls included, which it rewrites into torch
operations on copies: fastpe's functions called inside a compiled function then wrote
into those copies (a wrong result, silently) or failed inside dynamo. A package in
dynamo's skip list runs as Python runs it, between the graphs, as a C extension's call
does. Dynamo loads lazily (`import torch` does not load it), so the package is added
when its trace rules load, whichever of fastpe and torch was imported first.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

_RULES = "torch._dynamo.trace_rules"
_PACKAGE = __name__.rpartition(".")[0]


def _skip_package(rules: Any) -> None:
    try:
        rules.add(_PACKAGE)
    except Exception:
        # a torch whose rules have no add(): dynamo traces fastpe as before
        pass


class _WhenRulesLoad(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when dynamo's trace rules are imported, it lets the other
    finders find them and has their loader add fastpe once the module has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _RULES:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = None if spec is None else spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module: Any) -> None:
            run(module)
            _skip_package(module)

        setattr(loader, "exec_module", exec_module)  # noqa: B010  (mypy refuses assigning a method)
        return spec


if _RULES in sys.modules:
    _skip_package(sys.modules[_RULES])
else:
    sys.meta_path.insert(0, _WhenRulesLoad())
