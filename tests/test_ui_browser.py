"""The inspector end to end: `fastmem ui` in its own process, driven by headless Chromium.

Open a store, search, open a memory, build a context and check that the levels and token
counts the page shows are ``store.context()``'s, pin, forget, and see a memory another
process writes appear. Screenshots of each view are taken; with FASTMEM_UI_SCREENSHOTS=1
they go to docs/img/ui-*.png (the docs show them). Skipped when Chromium, Playwright or
the ``ui`` extra is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("FASTMEM_CHROMIUM", "/usr/bin/chromium")
pytest.importorskip("starlette", reason="the ui extra is not installed: pip install 'fastmem[ui]'")
pytest.importorskip("jinja2", reason="the ui extra is not installed: pip install 'fastmem[ui]'")
pytest.importorskip("uvicorn", reason="the ui extra is not installed: pip install 'fastmem[ui]'")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
    pytest.skip(
        f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)", allow_module_level=True
    )

import fastmem  # noqa: E402
from fastmem.embed import default_embedder  # noqa: E402

# The real model (shipped in the package) in every process here: the screenshots and the
# comparisons show hybrid search and contexts as users get them (the suite's default is none).
ENV = {**os.environ, "FASTMEM_EMBEDDER": "default"}

DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
# The screenshots go to the docs (docs/img/ui-*.png, committed) with FASTMEM_UI_SCREENSHOTS=1,
# else to a temporary folder: a test run leaves the working tree as it was (each run's
# screenshots differ a little: times, paths).
IMG = (
    DOCS_IMG
    if os.environ.get("FASTMEM_UI_SCREENSHOTS") == "1"
    else Path(tempfile.mkdtemp(prefix="fastmem-ui-shots-"))
)
DAY = 86400.0
START = 1_764_547_200.0  # 1 Dec 2025, 00:00 UTC: the screenshots show the same dates every run
QUESTION = "What did we decide about the Lisbon trip budget?"


def _fill(path: str) -> dict[str, str]:
    """A small agent's memory: three sessions of turns, facts, a tool result, a pin, and a
    fact superseded by a newer one."""
    turns = [
        (
            "trip-planning",
            0,
            [
                "user: I want to plan a trip to Lisbon in the spring, maybe five days.",
                "assistant: Lisbon in April is mild. Should I look at flights from Berlin?",
                "user: Yes, from Berlin. Keep the whole trip under 1,200 euros.",
                "assistant: Noted: a 1,200 EUR budget for flights, hotel and food.",
                "user: I prefer small hotels in Alfama over big chains.",
                "assistant: I found three guesthouses in Alfama between 90 and 120 EUR a night.",
            ],
        ),
        (
            "code-review",
            1,
            [
                "user: The CI fails on the integration tests since yesterday's merge.",
                "assistant: The failing test is test_checkout_flow; it times out after 30 s.",
                "user: Can you check whether the payment mock is still started?",
                "assistant: The mock server is not started in conftest.py after the refactor.",
                "user: Fix it and add a regression test please.",
                "assistant: Done: the fixture starts the mock again, and a new test checks it.",
            ],
        ),
        (
            "trip-planning",
            3,
            [
                "user: Flights are more expensive than I thought. Let's raise the Lisbon budget.",
                "assistant: With 1,500 EUR the Alfama guesthouse and direct flights both fit.",
                "user: OK, 1,500 euros it is. Book the guesthouse for 14-19 April.",
                "assistant: Booked Casa do Largo, 14-19 April, 4 nights at 105 EUR.",
            ],
        ),
    ]
    ids: dict[str, str] = {}
    with fastmem.open(path, embedder=default_embedder()) as store:
        ids["pinned"] = store.add(
            "The user's name is Ada; she lives in Berlin and prefers short answers.",
            type="fact",
            pinned=True,
            timestamp=START,
        )
        ids["old_budget"] = store.add(
            "Lisbon trip budget: 1,200 EUR in total.", type="fact", timestamp=START + 0.1 * DAY
        )
        for session, day, texts in turns:
            for i, text in enumerate(texts):
                mid = store.add(
                    text, session=session, timestamp=START + day * DAY + 9 * 3600 + i * 240
                )
        ids["new_budget"] = store.add(
            "Lisbon trip budget: 1,500 EUR in total (raised for flights).",
            type="fact",
            supersedes=ids["old_budget"],
            timestamp=START + 3 * DAY + 10 * 3600,
        )
        store.add(
            "pytest tests/integration -q: 42 passed, 0 failed in 61.2 s",
            type="tool_result",
            session="code-review",
            timestamp=START + DAY + 10 * 3600,
        )
        ids["to_pin"] = store.add(
            "Ada's frequent-flyer number is on file with the travel agent.",
            type="fact",
            timestamp=START + 2 * DAY,
        )
        ids["to_forget"] = store.add(
            "A scratch note to be forgotten.", type="plan", timestamp=START + 2.5 * DAY
        )
        ids["last"] = mid
        ids["live_target"] = store.add(
            "Ada's passport expires in March 2027.", type="fact", timestamp=START + 2.2 * DAY
        )
        for i in range(60):  # older history, so the timeline has pages
            store.add(
                f"user: small talk number {i} about the weather and the week.",
                session="chat",
                timestamp=START - DAY * (1 + i // 10) - i * 60,
            )
    return ids


@pytest.fixture(autouse=True)
def backend():
    """Once, not per kernel backend (conftest's): the inspector runs in its own process
    with its own kernels, and these tests change the store as they go."""
    return "default"


SERVER_LOG: list[Path] = []  # the running server's output, for a failing test's message


def served_log() -> str:
    return SERVER_LOG[0].read_text()[-3000:] if SERVER_LOG else "(no server)"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A store and `fastmem ui` serving it in its own process; yields (path, url, ids)."""
    path = str(tmp_path_factory.mktemp("ui") / "agent")
    ids = _fill(path)
    # The server's output goes to a file, read for its address: a pipe nobody reads past the
    # first line would block the server once whatever it writes later fills the pipe.
    log = tmp_path_factory.mktemp("ui-log") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fastmem", "ui", path, "--port", "0", "--no-browser"],
            stdout=out, stderr=subprocess.STDOUT, text=True, env=ENV,
        )  # fmt: skip
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"http://\S+\?token=\S+", log.read_text())
            if found:
                url = found.group(0)
            else:
                time.sleep(0.05)
        if url is None:
            proc.kill()
            pytest.fail(f"fastmem ui printed no address: {log.read_text()}")
        SERVER_LOG[:] = [log]
        yield path, url, ids
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def page(served):
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(
            viewport={"width": 1360, "height": 900}, device_scale_factor=1
        )
        page = context.new_page()
        page.set_default_timeout(30_000)
        # The printed address sets the session's cookie: every test starts with it, whichever
        # tests of this module ran before it on this worker (pytest-xdist spreads them).
        page.goto(served[1])
        yield page
        browser.close()


def _base(url: str) -> str:
    return url.split("/?token=")[0]


def _shot(page, name: str) -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMG / f"ui-{name}.png"), full_page=True)


def test_opening_the_printed_address_sets_the_cookie_and_drops_the_token(served, page):
    path, url, _ = served
    page.context.clear_cookies()  # as a browser that never opened the inspector
    assert page.goto(_base(url) + "/").status == 403  # no token, no cookie: refused
    page.goto(url)
    assert "token=" not in page.url  # redirected without it
    with fastmem.open(path, readonly=True, embedder=None) as store:
        assert page.locator("[data-testid=memories]").inner_text().replace(",", "") == str(
            len(store)
        )
    page.wait_for_selector("[data-testid=sessions] tr[data-session]")
    with fastmem.open(path, readonly=True, embedder=None) as store:
        stats, sessions = store.stats(), store.sessions()
    assert page.inner_text("[data-testid=format-version]").startswith(
        f"version {stats.format_version}"
    )
    shown = page.locator("[data-testid=sessions] tr[data-session]").evaluate_all(
        "rows => rows.map(r => [r.dataset.session, Number(r.cells[1].innerText.replace(/,/g, ''))])"
    )
    assert shown == [list(kv) for kv in sessions.items()]
    page.wait_for_selector("#live-count:has-text('memories')")
    _shot(page, "overview")


def test_timeline_pages_and_expands_a_memory(served, page):
    path, url, ids = served
    page.goto(_base(url) + "/timeline")
    rows = page.locator(".row[data-id]")
    assert rows.count() == 50
    first = rows.first.get_attribute("data-id")
    with fastmem.open(path, readonly=True, embedder=None) as store:
        assert first == store.recent(1)[0].id
    page.locator("#more").scroll_into_view_if_needed()  # the next page loads as it comes into view
    rows.nth(50).wait_for()  # the 51st row: the second page came (a page is 50)
    page.locator(f".row[data-id={ids['new_budget']}]").click()
    page.wait_for_selector(f"#detail-{ids['new_budget']} [data-testid=text]")
    assert (
        "1,500 EUR" in page.locator(f"#detail-{ids['new_budget']} [data-testid=text]").inner_text()
    )
    page.locator(f".row[data-id={ids['new_budget']}]").scroll_into_view_if_needed()
    page.screenshot(path=str(IMG / "ui-timeline.png"))  # the window, not the whole page


def test_search_and_open_a_memory(served, page):
    path, url, ids = served
    page.goto(_base(url) + "/search")
    page.fill("input[name=q]", "Lisbon budget")
    page.click("#search-form button.primary")
    page.wait_for_selector("[data-testid=hits] tr.hit")
    shown = page.locator("[data-testid=hits] tr.hit").evaluate_all(
        "rows => rows.map(r => r.dataset.id)"
    )
    with fastmem.open(path, readonly=True, embedder=default_embedder()) as store:
        store_ids = [h.id for h in store.search("Lisbon budget", 20)]
    assert shown == store_ids
    assert ids["new_budget"] in shown[:3]
    assert page.locator("[data-testid=hits] .part.pv").count() > 0  # the cosine part is shown
    _shot(page, "search")
    page.locator(f"[data-testid=hits] tr.hit[data-id={ids['old_budget']}] a.open").click()
    page.wait_for_selector("[data-testid=memory]")
    assert "superseded by " + ids["new_budget"] in page.inner_text("[data-testid=memory]")
    # The backward link: the new version's page lists the memory it supersedes.
    page.goto(_base(url) + "/memory/" + ids["new_budget"])
    page.wait_for_selector("[data-testid=older] a")
    older = page.locator("[data-testid=older] a").evaluate_all(
        "links => links.map(a => a.innerText)"
    )
    assert older == [ids["old_budget"]]
    page.click("details.changes summary")
    _shot(page, "memory")


def test_context_shows_what_context_returns(served, page):
    path, url, _ = served
    page.goto(_base(url) + "/context")
    page.fill("input[name=q]", QUESTION)
    page.fill("input[name=budget]", "160")
    page.click("[data-testid=build]")
    page.wait_for_selector("[data-testid=context-lines]")
    lines = page.locator("[data-testid=context-line]").evaluate_all(
        "rows => rows.map(r => [r.dataset.id, r.dataset.level, Number(r.dataset.tokens)])"
    )
    with fastmem.open(path, readonly=True, embedder=default_embedder()) as store:
        default_embedder().wait()
        ctx = store.context(QUESTION, 160)
    names = {
        fastmem.Level.PINNED: "pinned",
        fastmem.Level.RECENT: "level 1",
        fastmem.Level.FOUND: "level 3",
    }
    assert sorted(lines) == sorted([i.id, names[i.level], i.tokens] for i in ctx.items)
    summary = page.locator("[data-testid=context-summary]")
    assert summary.get_attribute("data-tokens") == str(ctx.tokens)
    assert page.text_content("#ctx-raw") == ctx.text
    left = page.locator("[data-testid=left-out] tr[data-id]").evaluate_all(
        "rows => rows.map(r => r.dataset.id)"
    )
    assert left == [i.id for i in ctx.left_out]
    assert ctx.left_out, "a 160-token budget leaves ranked memories out"
    _shot(page, "context")


def _change(page, base: str, mid: str, button: str) -> None:
    page.goto(f"{base}/memory/{mid}")
    page.click("details.changes summary")
    page.click(f"[data-testid={button}]")
    page.wait_for_selector("[data-testid=confirm]")
    page.click("[data-testid=confirm-button]")
    page.wait_for_selector(".flash")


def test_pin_and_forget(served, page):
    path, url, ids = served
    base = _base(url)
    _change(page, base, ids["to_pin"], "pin-toggle")
    assert page.locator("[data-testid=pinned]").count() == 1
    with fastmem.open(path, readonly=True, embedder=None) as store:
        assert store.get(ids["to_pin"]).pinned
    _change(page, base, ids["to_forget"], "forget")
    assert "/timeline" in page.url
    with fastmem.open(path, readonly=True, embedder=None) as store:
        assert ids["to_forget"] not in store


def test_another_process_write_appears(served, page):
    path, url, _ = served
    page.goto(_base(url) + "/timeline")
    try:  # the first poll's answer: the page's own load may wait on a busy machine
        page.wait_for_selector("#live-count:has-text('memories')", timeout=60_000)
    except Exception:
        pytest.fail(f"no live count on the page; the server said: {served_log()}")
    text = "assistant: A memory written by another process while the inspector was open."
    code = (
        "import fastmem, sys\n"
        "with fastmem.open(sys.argv[1]) as s:\n"
        "    s.add(sys.argv[2], session='trip-planning')\n"
    )
    subprocess.run([sys.executable, "-c", code, path, text], check=True, timeout=60, env=ENV)
    page.wait_for_selector(f".row:has-text('{text[:40]}')", timeout=15_000)
    page.screenshot(path=str(IMG / "ui-live.png"))


def _other_process(path: str, call: str) -> None:
    code = "import fastmem, sys\nwith fastmem.open(sys.argv[1]) as s:\n    " + call + "\n"
    subprocess.run([sys.executable, "-c", code, path], check=True, timeout=60, env=ENV)


def test_another_process_pin_and_forget_appear(served, page):
    """A memory's page and the timeline follow other processes' pins and forgets, not only
    their adds (the data file grows with every write; the pages poll its size)."""
    path, url, ids = served
    mid = ids["live_target"]
    page.goto(_base(url) + "/memory/" + mid)
    page.wait_for_selector("#live-count:has-text('memories')", timeout=60_000)
    assert page.locator("[data-testid=pinned]").count() == 0
    page.wait_for_selector("[data-testid=older-slot][data-loaded]", state="attached")
    asked: list[str] = []

    def note(request) -> None:
        asked.append(request.url)

    page.on("request", note)
    _other_process(path, f"s.pin({mid!r})")
    page.wait_for_selector("[data-testid=memory] [data-testid=pinned]", timeout=15_000)
    # The refresh keeps the older versions it had: no new search for them.
    assert [u for u in asked if u.endswith("/older")] == []
    assert [u for u in asked if "partial=page" in u]
    page.remove_listener("request", note)
    page.goto(_base(url) + "/timeline")
    page.wait_for_selector("#live-count:has-text('memories')", timeout=60_000)
    assert page.locator(f".row[data-id={mid}] .chip.lv-pinned").count() == 1
    _other_process(path, f"s.pin({mid!r}, False)")
    page.wait_for_selector(f".row[data-id={mid}] .pin:empty", state="attached", timeout=15_000)
    page.goto(_base(url) + "/memory/" + mid)
    page.wait_for_selector("#live-count:has-text('memories')", timeout=60_000)
    _other_process(path, f"s.forget({mid!r})")
    page.wait_for_selector("[data-testid=gone]", timeout=15_000)
    assert page.locator("[data-testid=memory].gone").count() == 1
    page.goto(_base(url) + "/timeline")
    assert page.locator(f".row[data-id={mid}]").count() == 0
