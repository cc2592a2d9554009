"""Sinusoidal encodings (Vaswani et al., 2017): sinusoidal_table(8192, 1024, out=buf)
against the textbook float32 NumPy construction, the best NumPy and a fill; add_sinusoidal
on (8, 2048, 1024) against a cached-table add and one streaming pass."""

import pytest

pytest.importorskip("pytest_benchmark")

from benchutil import cases, run_case

from fastpe import _bench

WORKLOADS = [w for w in _bench.workloads() if w.family == "sinusoidal"]


@pytest.mark.parametrize("wl, dtype, impl, threads", cases(WORKLOADS))
def test_sinusoidal(benchmark, wl, dtype, impl, threads):
    run_case(benchmark, wl, dtype, impl, threads)
