"""fastpe's benchmarks (pytest-benchmark): ``pytest bench/ --benchmark-only``.

Files are named ``bench_<family>.py`` and collected by the hook below, so plain
``pytest`` (testpaths = ["tests"]) never picks them up and the default
``python_files`` needs no change. Each file skips itself when pytest-benchmark is not
installed. The workloads, NumPy baselines and floors come from ``fastpe._bench`` (shared
with ``python -m fastpe bench``); ``benchutil.py`` turns them into parametrised
benchmarks, grouped per workload and dtype so that ``--benchmark-compare`` reads as one
table per group.

Useful options::

    pytest bench/ --benchmark-only                       # everything (a few minutes)
    pytest bench/bench_rope.py --benchmark-only -k "prefill and float32"
    pytest bench/ --benchmark-only --benchmark-autosave  # then --benchmark-compare
    pytest bench/ --benchmark-only --benchmark-columns=median,iqr,rounds
"""

from __future__ import annotations

import os

import pytest

import fastpe


def pytest_collect_file(file_path, parent):
    # a file named on the command line is collected by pytest itself, whatever its name
    if parent.session.isinitpath(file_path):
        return None
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


@pytest.fixture(scope="session", autouse=True)
def _one_blas_thread():
    """NumPy's OpenBLAS threads busy-wait after a BLAS call and can steal the core a
    benchmark runs on; nothing here calls BLAS, but limit them anyway (threadpoolctl is
    in the test extra) unless OPENBLAS_NUM_THREADS says otherwise."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(autouse=True)
def _restore_num_threads():
    yield
    fastpe.set_num_threads(None)


def pytest_report_header(config):
    info = fastpe.info()
    line = (f"fastpe {info['version']} from {os.path.dirname(fastpe.__file__)}: "
            f"backend={info['backend']} isa={info['isa']} openmp={info['openmp']} "
            f"num_threads={info['num_threads']}")
    if not info["compiled"]:
        line += "  WARNING: compiled kernels not loaded, 'fastpe' is the NumPy fallback"
    return [line]
