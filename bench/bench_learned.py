"""Learned tables (BERT, GPT-2): add_learned on (8, 2048, 1024) against a broadcast NumPy add of
the table slice and one streaming pass."""

import pytest

pytest.importorskip("pytest_benchmark")

from benchutil import cases, run_case

from fastpe import _bench

WORKLOADS = [w for w in _bench.workloads() if w.family == "learned"]


@pytest.mark.parametrize("wl, dtype, impl, threads", cases(WORKLOADS))
def test_learned(benchmark, wl, dtype, impl, threads):
    run_case(benchmark, wl, dtype, impl, threads)
