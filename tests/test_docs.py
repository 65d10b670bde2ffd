"""The documentation a newcomer reads: a short README, a docstring on every public name, the
README's test command the one CI runs, and a documentation site that builds strictly."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fastmem

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
DOCS = ROOT / "docs"

README_MAX_LINES = 300

# The README, .ci/run and docs/ are the checkout's: a wheel's test run copies tests/ only, and
# then checks the docstrings alone.
in_checkout = pytest.mark.skipif(
    not (README.is_file() and CI_RUN.is_file() and DOCS.is_dir()),
    reason="the README, .ci/run and docs/ are not beside the tests (a wheel's test run)",
)

# The modules an edge module may import (tests/test_structure.py) are fastmem's public API.
PUBLIC_MODULES = ["fastmem.types", "fastmem.errors", "fastmem.export", "fastmem.embed",
                  "fastmem.tokens", "fastmem.namespaces", "fastmem.summarize",
                  "fastmem.doctor"]  # fmt: skip

# What a user must not read: the team's bookkeeping (the journal keeps it as history).
BOOKKEEPING = re.compile(
    r"\bissues? #?\d+|\bround `|\bbranch `|\bthis branch\b|\bmain [0-9a-f]{7}\b", re.IGNORECASE
)


@pytest.fixture(autouse=True)
def backend():
    """Documentation checks exercise no kernel: one run, not one per backend."""
    return fastmem.BACKEND


@in_checkout
def test_readme_is_at_most_300_lines():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; keep it to {README_MAX_LINES} and move the rest into "
        "the documentation site (docs/)"
    )


# --- docstrings ------------------------------------------------------------------------


def _missing_doc(obj: object) -> bool:
    doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
    doc = (doc or "").strip()
    if inspect.isclass(obj) and doc.startswith(f"{obj.__name__}("):
        return True  # the signature dataclasses and namedtuples write when there is none
    return not doc


def _public_names(module: object) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items()
                 if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__]
    return [n for n in names if not n.startswith("_") and n != "BACKEND"]


def _undocumented(where: str, module: object) -> list[str]:
    missing = []
    for name in _public_names(module):
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue  # constants are described by the pages that use them
        if _missing_doc(obj):
            missing.append(f"{where}.{name}")
        if not inspect.isclass(obj):
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            func = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if (inspect.isfunction(func) or isinstance(value, property)) and _missing_doc(func):
                missing.append(f"{where}.{name}.{attr}")
    return missing


def test_every_public_name_has_a_docstring():
    missing = _undocumented("fastmem", fastmem)
    for modname in PUBLIC_MODULES:
        missing += _undocumented(modname, importlib.import_module(modname))
    assert not missing, "public names without a docstring: " + ", ".join(sorted(set(missing)))


def test_the_docstring_check_catches_a_missing_docstring():
    class Documented:
        """Has one."""

        def method(self) -> None:
            pass

        @property
        def value(self) -> int:
            return 1

    module = type(sys)("fake")
    module.Documented = Documented
    module.__all__ = ["Documented"]
    assert _undocumented("fake", module) == ["fake.Documented.method", "fake.Documented.value"]


# --- the README's Quickstart and .ci/run ------------------------------------------------


def _quickstart_lines() -> list[str]:
    """The lines of the code blocks in the README's "Quickstart" section."""
    text = README.read_text(encoding="utf-8")
    section = r"^## Quickstart\s*$(.*?)(?=^## )"
    match = re.search(section, text + "\n## end", re.MULTILINE | re.DOTALL)
    assert match, "README.md has no '## Quickstart' section"
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", match.group(1), re.MULTILINE | re.DOTALL)
    assert blocks, "the README's Quickstart section has no code block"
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def _ci_test_command() -> str:
    """The test command .ci/run runs, extracted from README.md by .ci/run's own shell code."""
    script = CI_RUN.read_text(encoding="utf-8")
    match = re.search(r"^test_cmd=\$\((.*)\)\s*$", script, re.MULTILINE)
    assert match, (".ci/run no longer takes its test command from README.md (no 'test_cmd=$(...)'"
                   " line): the README's Quickstart and CI can drift apart")  # fmt: skip
    assert "README.md" in match.group(1), ".ci/run's test command is not read from README.md"
    result = subprocess.run(["bash", "-c", match.group(1)], check=False, cwd=ROOT,
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    return result.stdout.strip()


def _without_comment(line: str) -> str:
    return re.sub(r"\s+#[^'\"]*$", "", line).strip()


@in_checkout
def test_readme_quickstart_holds_the_test_command_ci_runs():
    command = _ci_test_command()
    assert command, ".ci/run finds no test command in README.md"
    assert "python -m pytest" in command, f"the test command runs no pytest: {command!r}"
    quickstart = [_without_comment(line) for line in _quickstart_lines()]
    assert command in quickstart, (
        f"the test command .ci/run runs ({command!r}) is not a line of the README's Quickstart "
        f"block; the Quickstart shows: {quickstart}"
    )


@in_checkout
def test_readme_quickstart_has_exactly_one_test_command():
    runs_tests = [line for line in _quickstart_lines() if "pytest" in line]
    assert len(runs_tests) == 1, f"the Quickstart should show one test command: {runs_tests}"


# --- what a user reads carries no bookkeeping --------------------------------------------


def _user_pages() -> list[Path]:
    pages = [p for p in DOCS.rglob("*.md") if "journal" not in p.relative_to(DOCS).parts]
    return [README, *sorted(pages)]


@in_checkout
def test_user_facing_pages_name_no_issues_branches_or_rounds():
    found = []
    for page in _user_pages():
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if BOOKKEEPING.search(line):
                found.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "move the history to docs/journal/:\n" + "\n".join(found[:40])


def test_the_bookkeeping_check_catches_an_issue_number():
    assert BOOKKEEPING.search("measured as in issue 21's round")
    assert BOOKKEEPING.search("after round `tokens`")
    assert not BOOKKEEPING.search("a round trip and pickling of the hits")


# --- the site -----------------------------------------------------------------------------


@in_checkout
def test_the_cli_reference_lists_every_command():
    sys.path.insert(0, str(DOCS))
    try:
        hooks = importlib.import_module("hooks")
    finally:
        sys.path.remove(str(DOCS))
    page = hooks.render_cli()
    from fastmem.cli import build_parser

    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    for name in commands:
        assert f"### `fastmem {name}`" in page, f"fastmem {name} is missing from the CLI page"
    assert "`fastmem ray jobs run`" in page
    assert "--timeout" in page and "--budget" in page


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with ``mkdocs build --strict`` (a warning fails the build)."""
    if not DOCS.is_dir():
        pytest.skip("docs/ is not beside the tests (a wheel's test run copies tests/ only)")
    mkdocs = shutil.which("mkdocs") or str(Path(sys.executable).parent / "mkdocs")
    if not Path(mkdocs).exists():
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings[python] is not "
                        "installed (pip install -e '.[docs]')")  # fmt: skip
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(out)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + result.stderr[-4000:]
    return out


def test_mkdocs_build_strict(site: Path):
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    anchors = set(re.findall(r'id="(fastmem\.[\w.]+)"', api))
    # Every name of fastmem.__all__ has an entry, under fastmem or the module defining it
    # (BACKEND and __version__ are module attributes the page's text describes).
    undocumented = [
        name for name in fastmem.__all__ if name not in ("BACKEND", "__version__")
        and not {f"fastmem.{name}", f"fastmem.types.{name}", f"fastmem.errors.{name}",
                 f"fastmem.store.{name}"} & anchors
    ]  # fmt: skip
    assert not undocumented, f"the API page has no entry for: {undocumented}"
    assert "fastmem.BACKEND" in api and "fastmem.__version__" in api
    cli = (site / "operations" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "fastmem verify" in cli and "--budget" in cli
    assert not (site / "hooks.py").exists(), "the build hook was published with the site"


# The pages a newcomer looks at first: the home page, a guide, the API reference.
SCREENSHOT_PAGES = ["index.html", "guides/hermes/index.html", "reference/api/index.html"]


@pytest.mark.parametrize("page", SCREENSHOT_PAGES)
def test_a_browser_renders_the_page(site: Path, page: str, tmp_path: Path):
    """Headless Chromium screenshots the built page as a reader would see it. An empty or
    failed page makes a PNG of a few kilobytes; these pages make hundreds. (The screenshots
    were also looked at by eye when the site was laid out.)"""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium to look at the site with")
    shot = tmp_path / "page.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={shot}", "--window-size=1280,1600", (site / page).as_uri()],
        check=False, capture_output=True, timeout=120,
    )  # fmt: skip
    assert shot.exists(), f"chromium made no screenshot of {page}"
    assert shot.stat().st_size > 60_000, f"{page} renders nearly blank ({shot.stat().st_size} B)"
