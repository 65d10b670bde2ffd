"""Every script in examples/ runs, as a user would run it, so that none can rot.

Each example runs in a fresh Python process from an empty working directory, with a timeout,
and must exit 0 and leave that directory empty (examples write only to a temporary
directory). An example whose first lines say ``# requires: mod1 mod2`` is skipped, naming
the module, when one of those modules is not importable.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fastmem

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TIMEOUT = 180  # seconds: a few are enough on a quiet machine; the test machines are shared
REQUIRES = re.compile(r"^#\s*requires:\s*(.+?)\s*$")
HEAD_LINES = 10  # where a `# requires:` line is looked for

pytestmark = pytest.mark.skipif(
    not (ROOT / "examples").is_dir(),
    reason="examples/ is not beside the tests (a wheel's test run copies tests/ only)",
)


@pytest.fixture(autouse=True)
def backend():
    """Each example runs in its own process on the default kernels: one run, not one per
    backend."""
    return fastmem.BACKEND


def required_modules(script: Path) -> list[str]:
    """The modules a ``# requires:`` line among the script's first lines names."""
    with script.open(encoding="utf-8") as f:
        head = [next(f, "") for _ in range(HEAD_LINES)]
    for line in head:
        match = REQUIRES.match(line.strip())
        if match:
            return match.group(1).split()
    return []


def _missing(modules: list[str]) -> list[str]:
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package that is not installed
            found = False
        if not found:
            missing.append(name)
    return missing


def test_the_basic_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"basics.py", "agent_loop.py"} <= names


def test_requires_lines_are_read(tmp_path):
    script = tmp_path / "x.py"
    script.write_text('"""Doc."""\n# requires: langgraph  openai\nimport fastmem\n')
    assert required_modules(script) == ["langgraph", "openai"]
    script.write_text("import fastmem\n")
    assert required_modules(script) == []
    assert _missing(["fastmem", "no_such_module_here.sub"]) == ["no_such_module_here.sub"]


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(script: Path, tmp_path: Path):
    missing = _missing(required_modules(script))
    if missing:
        pytest.skip(f"{script.name} requires {', '.join(missing)}, which is not installed")
    env = dict(os.environ)
    # As a user runs it: with the default embedder (the suite's conftest turns it off).
    env.pop("FASTMEM_EMBEDDER", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    try:
        result = subprocess.run([sys.executable, str(script)], check=False, cwd=workdir, env=env,
                                capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script.name} did not finish within {TIMEOUT} s")
    assert result.returncode == 0, (
        f"{script.name} exited {result.returncode}\n--- stdout\n{result.stdout[-2000:]}"
        f"\n--- stderr\n{result.stderr[-4000:]}"
    )
    assert result.stdout.strip(), f"{script.name} printed nothing: an example shows its result"
    left = sorted(p.name for p in workdir.iterdir())
    assert not left, f"{script.name} left files in its working directory: {left}"
