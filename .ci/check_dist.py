"""Check the listings of built archives: python .ci/check_dist.py dist/ | FILE...

A wheel: every compiled module of fastmem/_kernels/_ext with its .pyi stub, py.typed, no source
(.pyx/.pxd/.c/.h) and no bundled shared library (a fastmem.libs/ folder from auditwheel). An
sdist: what building needs (setup.py, every .pyx, .pxd and header of src_cython), and no
generated .c. A folder: each fastmem wheel and the one sdist in it. Run from the checkout.
"""

import sys
import tarfile
import zipfile
from pathlib import Path, PurePosixPath


def wheel_problems(wheel: Path) -> list[str]:
    names = [PurePosixPath(n) for n in zipfile.ZipFile(wheel).namelist()]
    ext = [n for n in names if n.parent.as_posix() == "fastmem/_kernels/_ext"]
    compiled = {n.name.split(".")[0] for n in ext if n.suffix == ".so"}
    stubs = {n.stem for n in ext if n.suffix == ".pyi"}
    expected = {p.stem for p in Path("src_cython").glob("*.pyx")}
    problems = []
    if compiled != expected:
        problems.append(f"compiled modules {sorted(compiled)}, expected {sorted(expected)}")
    if stubs != compiled:
        problems.append(f"stubs {sorted(stubs)} do not match compiled modules {sorted(compiled)}")
    if PurePosixPath("fastmem/py.typed") not in names:
        problems.append("no fastmem/py.typed")
    problems += [f"source file {n}" for n in names if n.suffix in (".pyx", ".pxd", ".c", ".h")]
    problems += [f"bundled library {n}" for n in names if n.parts[0].endswith(".libs")]
    print(f"{wheel.name}: {len(compiled)} compiled modules, each with its stub")
    return [f"{wheel.name}: {p}" for p in problems]


def sdist_problems(sdist: Path) -> list[str]:
    with tarfile.open(sdist) as tar:
        members = {PurePosixPath(*PurePosixPath(m).parts[1:]) for m in tar.getnames()}
    needed = [PurePosixPath(p.as_posix()) for p in sorted(Path("src_cython").iterdir())
              if p.suffix in (".pyx", ".pxd", ".h")] + [PurePosixPath("setup.py")]  # fmt: skip
    problems = [f"missing {p}" for p in needed if p not in members]
    problems += [f"generated file {m}" for m in members if m.suffix == ".c"]
    print(f"{sdist.name}: buildable")
    return [f"{sdist.name}: {p}" for p in problems]


def main(args: list[str]) -> int:
    files: list[Path] = []
    for arg in map(Path, args):
        if arg.is_dir():
            wheels, sdists = sorted(arg.glob("fastmem-*.whl")), sorted(arg.glob("fastmem-*.tar.gz"))
            if not wheels or len(sdists) != 1:
                print(f"expected wheels and one sdist in {arg}, found {wheels + sdists}", file=sys.stderr)
                return 1
            files += wheels + sdists
        else:
            files.append(arg)
    if not files:
        print(__doc__, file=sys.stderr)
        return 2
    problems = []
    for f in files:
        problems += wheel_problems(f) if f.suffix == ".whl" else sdist_problems(f)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
