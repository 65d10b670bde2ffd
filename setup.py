"""Build the private compiled kernels: src_cython/*.pyx -> fastmem._kernels._ext.*.

Environment:
  FASTMEM_NO_EXT=1   build no extension (the numpy reference kernels are used)
  FASTMEM_DEBUG=1    bounds checks on, -O0 -g
  FASTMEM_NATIVE=1   -march=native (faster on this machine, not portable: never for wheels)
  FASTMEM_NO_OPENMP=1  build the top-k scan without OpenMP (one thread)

The top-k scan is compiled with OpenMP (-fopenmp) when the compiler accepts it (checked by
compiling a small program), and serially otherwise.
"""

import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).parent
DEBUG = os.environ.get("FASTMEM_DEBUG") == "1"
NATIVE = os.environ.get("FASTMEM_NATIVE") == "1"
# The modules are translated and compiled on every core, not one at a time (~80 s on 2 cores:
# a build of each wheel in CI, and of the checkout for the tests).
JOBS = os.cpu_count() or 1


OPENMP_TEST = "#include <omp.h>\nint main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }\n"


def openmp_flags() -> list[str]:
    """``["-fopenmp"]`` if the C compiler builds and links an OpenMP program with it."""
    if os.environ.get("FASTMEM_NO_OPENMP") == "1" or sys.platform == "win32":
        return []
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "omp.c"
        src.write_text(OPENMP_TEST)
        try:
            done = subprocess.run([*cc, "-fopenmp", str(src), "-o", str(Path(tmp) / "omp")],
                                  capture_output=True, check=False)  # fmt: skip
        except OSError:
            return []
    return ["-fopenmp"] if done.returncode == 0 else []


def extensions():
    if os.environ.get("FASTMEM_NO_EXT") == "1":
        return []
    import numpy
    from Cython.Build import cythonize

    directives = {
        "language_level": 3,
        "boundscheck": DEBUG,
        "wraparound": False,
        "cdivision": True,
        "initializedcheck": DEBUG,
        "embedsignature": True,
        "autotestdict": False,  # no __test__ dict: the .pyi stubs list every public name
    }
    # No FMA contraction: the kernels must round exactly as their numpy references do.
    flags = ["-O0", "-g"] if DEBUG else ["-O3"]
    flags.append("-ffp-contract=off")
    if NATIVE:
        flags.append("-march=native")
    omp = openmp_flags()
    threaded = {"topk", "scoring"}  # the modules with prange loops
    sources = sorted((HERE / "src_cython").glob("*.pyx"))
    if not sources:  # e.g. an sdist without them: never build a wheel without its kernels
        raise SystemExit("setup.py: no src_cython/*.pyx to build (FASTMEM_NO_EXT=1 builds none)")
    exts = [
        Extension(
            f"fastmem._kernels._ext.{pyx.stem}",
            [str(pyx.relative_to(HERE))],
            include_dirs=[numpy.get_include(), "src_cython"],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            extra_compile_args=flags + (omp if pyx.stem in threaded else []),
            extra_link_args=omp if pyx.stem in threaded else [],
        )
        for pyx in sources
    ]
    return cythonize(exts, include_path=["src_cython"], compiler_directives=directives,
                     nthreads=JOBS)


setup(ext_modules=extensions(), options={"build_ext": {"parallel": JOBS}})
