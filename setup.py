"""Build the compiled kernels of fastpe.

One Cython source, ``fastpe/_kernels/kernels.pyx``, is compiled once per
instruction-set level: ``kernels_baseline`` everywhere, plus ``kernels_avx2``
(AVX2 + FMA + F16C + BMI2) and ``kernels_avx512`` (those and AVX-512 F, BW, DQ, VL)
on x86-64. ``fastpe._kernels`` chooses one for the CPU at import time (CPUID, and
XGETBV for the OS's saving of the wider registers), so a wheel stays portable (no
``-march=native``) while still running wide vector code. Without ``FASTPE_ISA``
that is kernels_avx512 on CPUs that run it at full width (Intel's, AMD's from Zen 5)
and kernels_avx2 elsewhere: kernels_avx512 measured faster in half precision on an
Intel Xeon, and on an AMD Zen 4, which executes 512-bit vectors as two 256-bit halves,
faster in half-precision RoPE but slower on a float32 ALiBi decode (README, "Backends
and threads").

Environment variables read here:

FASTPE_FAIL_NO_OPENMP=1
    Fail the build when the compiler cannot build OpenMP code (CI sets it).
    Without it a compiler lacking OpenMP only warns and builds serial kernels.
FASTPE_DISABLE_OPENMP=1
    Build serial kernels on purpose.
FASTPE_ISA_VARIANTS=baseline,avx2,avx512
    Which variants to build (default: all the platform supports; baseline always).
FASTPE_DEBUG=1
    Cython bounds checks and wraparound back on, ``-O0 -g3``: slow, for debugging.
FASTPE_SANITIZE=address,undefined
    Build with those sanitizers (``-fsanitize=...``); see README "Development".
FASTPE_LIBOMP_PREFIX=/path
    macOS: the prefix of the libomp to build and link against (default: Homebrew's).
"""

import os
import platform
import runpy
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KERNEL_SOURCE = "fastpe/_kernels/kernels.pyx"

# Flags per variant and compiler family. x86-64 baselines are SSE2 (the ABI
# minimum); the wider variants only run after a CPUID (and XGETBV) check at import.
# GCC and clang vectorise the plain loops 512 bits wide with the AVX-512 flags (their
# default tuning prefers the widest vectors); the intrinsic loops of fastpe_math.h
# have 512-bit forms of their own (masked tails).
ISA_FLAGS = {
    "unix": {
        "baseline": [],
        # -ffp-contract=fast, GCC's default in its GNU modes, spelled out: the element
        # loops' a + b * c must fuse as the vector loops' explicit FMAs do (the same
        # bits on every path), whatever -std or compiler (clang fuses only within
        # an expression by default)
        "avx2": ["-mavx2", "-mfma", "-mf16c", "-mbmi2", "-ffp-contract=fast"],
        "avx512": ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx2", "-mfma",
                   "-mf16c", "-mbmi2", "-ffp-contract=fast"],
    },
    "msvc": {
        "baseline": [],
        "avx2": ["/arch:AVX2"],
        "avx512": ["/arch:AVX512"],
    },
}


def _env_flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _is_x86_64():
    machine = platform.machine().lower()
    # cibuildwheel cross-builds macOS arm64 on x86 hosts (and back) through ARCHFLAGS.
    archflags = os.environ.get("ARCHFLAGS", "")
    if sys.platform == "darwin" and archflags:
        return "x86_64" in archflags and "arm64" not in archflags
    return machine in ("x86_64", "amd64")


def _variants():
    wanted = os.environ.get("FASTPE_ISA_VARIANTS")
    available = ["baseline", "avx2", "avx512"] if _is_x86_64() else ["baseline"]
    if not wanted:
        return available
    names = [v.strip() for v in wanted.split(",") if v.strip()]
    unknown = sorted(set(names) - set(available))
    if unknown or "baseline" not in names:
        raise SystemExit(f"FASTPE_ISA_VARIANTS={wanted!r}: must include 'baseline' and only "
                         f"name variants this platform supports: {available}")
    return names


OPENMP_PROBE = textwrap.dedent(
    """
    #include <omp.h>
    #include <stdio.h>
    int main(void) {
        int n = 0;
        #pragma omp parallel reduction(+:n)
        n += 1;
        printf("%d\\n", n > 0 && omp_get_max_threads() > 0);
        return 0;
    }
    """
)


def _openmp_flags(compiler):
    """(compile args, link args) that give OpenMP with this compiler."""
    if compiler.compiler_type == "msvc":
        return ["/openmp"], []
    if sys.platform == "darwin":
        # Apple clang has no -fopenmp driver flag; libomp comes from Homebrew
        # (cibuildwheel installs it in before-all and delocate bundles it).
        prefix = os.environ.get("FASTPE_LIBOMP_PREFIX") or _brew_libomp_prefix()
        cflags = ["-Xpreprocessor", "-fopenmp"]
        ldflags = ["-lomp"]
        if prefix:
            cflags.append(f"-I{prefix}/include")
            ldflags = [f"-L{prefix}/lib", "-lomp", f"-Wl,-rpath,{prefix}/lib"]
        return cflags, ldflags
    return ["-fopenmp"], ["-fopenmp"]


def _brew_libomp_prefix():
    for candidate in ("/opt/homebrew/opt/libomp", "/usr/local/opt/libomp"):
        if os.path.isdir(candidate):
            return candidate
    brew = shutil.which("brew")
    if brew:
        out = subprocess.run([brew, "--prefix", "libomp"], capture_output=True, text=True)
        if out.returncode == 0 and os.path.isdir(out.stdout.strip()):
            return out.stdout.strip()
    return None


def _probe_openmp(compiler, cflags, ldflags):
    """Compile, link and run a tiny OpenMP program; True when it works."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as fh:
            fh.write(OPENMP_PROBE)
        try:
            objects = compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
            exe = os.path.join(tmp, "probe")
            compiler.link_executable(objects, exe, extra_postargs=ldflags)
            if sys.platform == "win32":
                exe += ".exe"
            if not os.path.exists(exe):
                return False
            # Cross-compiling (e.g. macOS universal builds) can't run the probe;
            # a successful link is then the best evidence there is.
            if _is_x86_64() != (platform.machine().lower() in ("x86_64", "amd64")):
                return True
            out = subprocess.run([exe], capture_output=True, text=True, timeout=60)
            return out.returncode == 0 and out.stdout.strip() == "1"
        except Exception as exc:  # compiler errors come in many classes
            print(f"fastpe: OpenMP probe failed: {exc}", file=sys.stderr)
            return False


def _compiles(compiler, flags=()):
    """Whether the compiler compiles a trivial C file at all (with flags: and takes them
    without a word: a warning is an error here)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "empty.c")
        with open(src, "w") as fh:
            fh.write("int fastpe_probe(void) { return 0; }\n")
        try:
            compiler.compile([src], output_dir=tmp,
                             extra_postargs=list(flags) + (["-Werror"] if flags else []))
        except Exception:  # compiler errors come in many classes
            return False
        return True


class BuildExt(build_ext):
    def build_extensions(self):
        compiler = self.compiler
        family = "msvc" if compiler.compiler_type == "msvc" else "unix"
        if not _compiles(compiler):
            raise SystemExit("fastpe: the C compiler cannot compile a one-line C file: "
                             "building fastpe from source needs a working C compiler (GCC "
                             "or clang; MSVC on Windows), or install one of its wheels")
        openmp = not _env_flag("FASTPE_DISABLE_OPENMP")
        cflags, ldflags = _openmp_flags(compiler)
        if openmp and not _probe_openmp(compiler, cflags, ldflags):
            need = "Install an OpenMP runtime (libgomp, or libomp on macOS) to get threads."
            if _env_flag("FASTPE_FAIL_NO_OPENMP"):
                raise SystemExit(f"fastpe: the C compiler cannot build OpenMP programs, and "
                                 f"FASTPE_FAIL_NO_OPENMP is set. {need}")
            warnings.warn(f"fastpe: the C compiler cannot build OpenMP programs; building "
                          f"serial kernels. {need}", stacklevel=2)
            openmp = False
        if not openmp:
            cflags, ldflags = [], []

        if family == "msvc":
            common = ["/O2", "/fp:precise"]
        elif _env_flag("FASTPE_DEBUG"):
            common = ["-O0", "-g3"]
        else:
            # -O3 turns on the loop vectoriser's full cost model on older GCCs; -g0
            # overrides the interpreter's -g (debug info would be five sixths of a wheel)
            common = ["-O3", "-g0", "-fno-math-errno", "-Wno-unused-function"]
            # Every loop starts a 64-byte block. On an AMD Zen 4 a loop of a few
            # instructions that straddles two blocks took 1.5x the time over a buffer in
            # the caches (the bench floor's in-place pass over a batched decode's 1 MiB:
            # 18.6 us against 12.4), and which loops straddled moved with any change to
            # unrelated code. (GCC and clang; a compiler that does not take it goes without.)
            if _compiles(compiler, ["-falign-loops=64"]):
                common.append("-falign-loops=64")
        sanitize = os.environ.get("FASTPE_SANITIZE", "").strip()
        if sanitize and family == "unix":
            common += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g"]
            ldflags = ldflags + [f"-fsanitize={sanitize}"]

        for ext in self.extensions:
            variant = ext.name.rsplit("_", 1)[-1]
            isa = ISA_FLAGS[family].get(variant, [])
            ext.extra_compile_args = common + isa + cflags
            ext.extra_link_args = ldflags
            ext.define_macros = ext.define_macros + [
                ("FASTPE_ISA", f'"{variant}"'),
                ("FASTPE_COMPILE_FLAGS", '"' + " ".join(common + isa + cflags) + '"'),
            ]
        super().build_extensions()


def _write_constants():
    """fastpe/_kernels/_constants.pxi from fastpe/_constants.py, the one definition of
    what the kernels and the Python layer share."""
    c = runpy.run_path(os.path.join("fastpe", "_constants.py"))
    lines = ["# Generated by setup.py from fastpe/_constants.py at every build: edit that file.",
             "", "cdef enum:"]
    for name in ("POSITIONS_STACK", "MAX_AXES", "DYNAMIC_SPLIT", "DYNAMIC_PAIRS_STACK",
                 "MAX_THREADS_FLOOR", "VIEW_DIMS", "T5_BYTES_WEIGHT"):
        lines.append(f"    {name} = {c[name]}")
    lines.append(f"    DYNAMIC_BLOCKS = {c['DYNAMIC_PAIRS_STACK'] // c['DYNAMIC_SPLIT']}")
    for name, code in c["LAYOUT_CODES"].items():
        lines.append(f"    LAYOUT_{name.upper()} = {code}")
    short = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16"}
    for name, code in c["STORAGE_CODES"].items():
        lines.append(f"    CODE_{short[name]} = {code}")
    lines += ["", f"cdef int64_t MAX_ANGLE_POSITION = {c['MAX_ANGLE_POSITION']}",
              f"cdef double MAX_INV_FREQ = {c['MAX_INV_FREQ']!r}", ""]
    text = "\n".join(lines)
    path = os.path.join("fastpe", "_kernels", "_constants.pxi")
    try:
        with open(path) as f:
            if f.read() == text:
                return  # unchanged: no rebuild of the kernels for it
    except OSError:
        pass
    with open(path, "w") as f:
        f.write(text)


def _extensions():
    _write_constants()
    debug = _env_flag("FASTPE_DEBUG")
    directives = {
        "language_level": 3,
        "boundscheck": debug,
        "wraparound": debug,
        "initializedcheck": debug,
        "cdivision": True,
        "embedsignature": True,
        "autotestdict": False,
        "freethreading_compatible": True,
    }
    macros = [("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")]
    extensions = []
    for variant in _variants():
        ext = Extension(
            f"fastpe._kernels.kernels_{variant}",
            [KERNEL_SOURCE],
            include_dirs=[numpy.get_include(), "fastpe/_kernels"],
            define_macros=list(macros),
        )
        # Each variant needs its own generated C file: the module name is baked in; so
        # do debug builds (cythonize regenerates a file for changed sources, not for
        # changed directives)
        extensions += cythonize(
            [ext],
            build_dir=os.path.join("build", f"cython-{variant}" + ("-debug" if debug else "")),
            compiler_directives=directives,
            quiet=True,
        )
    return extensions


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})
