"""Build the private compiled kernels: src_cython/*.pyx -> fastmem._ext.*.

Environment:
  FASTMEM_NO_EXT=1   build no extension (the numpy reference kernels are used)
  FASTMEM_DEBUG=1    bounds checks on, -O0 -g
  FASTMEM_NATIVE=1   -march=native (faster on this machine, not portable: never for wheels)
"""

import os
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).parent
DEBUG = os.environ.get("FASTMEM_DEBUG") == "1"
NATIVE = os.environ.get("FASTMEM_NATIVE") == "1"


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
    exts = [
        Extension(
            f"fastmem._ext.{pyx.stem}",
            [str(pyx.relative_to(HERE))],
            include_dirs=[numpy.get_include(), "src_cython"],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            extra_compile_args=flags,
        )
        for pyx in sorted((HERE / "src_cython").glob("*.pyx"))
    ]
    return cythonize(exts, include_path=["src_cython"], compiler_directives=directives)


setup(ext_modules=extensions())
