"""Check the listings of the built archives: python .ci/check_dist.py dist/

The wheel: every compiled module of fastmem/_ext with its .pyi stub, py.typed, and no
source (.pyx/.pxd/.c/.h). The sdist: what building needs (setup.py, every .pyx, .pxd and
header of src_cython), and no generated .c.
"""

import sys
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

dist = Path(sys.argv[1])
problems = []

wheels = sorted(dist.glob("fastmem-*.whl"))
sdists = sorted(dist.glob("fastmem-*.tar.gz"))
if len(wheels) != 1 or len(sdists) != 1:
    sys.exit(f"expected one wheel and one sdist in {dist}, found {wheels + sdists}")

names = [PurePosixPath(n) for n in zipfile.ZipFile(wheels[0]).namelist()]
compiled = {n.name.split(".")[0] for n in names if n.parent.as_posix() == "fastmem/_ext" and n.suffix == ".so"}
stubs = {n.stem for n in names if n.parent.as_posix() == "fastmem/_ext" and n.suffix == ".pyi"}
expected = {p.stem for p in Path("src_cython").glob("*.pyx")}
if compiled != expected:
    problems.append(f"wheel: compiled modules {sorted(compiled)}, expected {sorted(expected)}")
if stubs != compiled:
    problems.append(f"wheel: stubs {sorted(stubs)} do not match compiled modules {sorted(compiled)}")
if PurePosixPath("fastmem/py.typed") not in names:
    problems.append("wheel: no fastmem/py.typed")
problems += [f"wheel: source file {n}" for n in names if n.suffix in (".pyx", ".pxd", ".c", ".h")]

with tarfile.open(sdists[0]) as tar:
    members = {PurePosixPath(*PurePosixPath(m).parts[1:]) for m in tar.getnames()}
needed = [PurePosixPath(p.as_posix()) for p in sorted(Path("src_cython").iterdir())
          if p.suffix in (".pyx", ".pxd", ".h")] + [PurePosixPath("setup.py")]  # fmt: skip
problems += [f"sdist: missing {p}" for p in needed if p not in members]
problems += [f"sdist: generated file {m}" for m in members if m.suffix == ".c"]

for problem in problems:
    print(problem, file=sys.stderr)
if problems:
    sys.exit(1)
print(f"{wheels[0].name}: {len(compiled)} compiled modules, each with its stub; {sdists[0].name}: buildable")
