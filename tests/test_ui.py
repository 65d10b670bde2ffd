"""The inspector over HTTP (Starlette's TestClient, and one real server): its security
(token, Host, Origin, CSRF, headers, loopback), each view, the changes, and a hostile store
(huge texts, control characters, HTML and script, 100k characters of metadata).

The browser end to end is tests/test_ui_browser.py.
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed: pip install 'fastmem[ui]'")
pytest.importorskip("jinja2", reason="the ui extra is not installed: pip install 'fastmem[ui]'")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

from starlette.testclient import TestClient

import fastmem
from fastmem.ui import REQUIRES, require
from fastmem.ui.app import create_app
from fastmem.ui.security import Secrets

TOKEN, CSRF = "the-run-token", "the-csrf-token"
BASE = "http://127.0.0.1:8765"
COOKIE = "fastmem_ui_8765"
SCRIPT = "<script>alert('memory')</script>"
ATTR = '"><img src=x onerror=alert(1)>'
CONTROLS = "bell\x07 escape\x1b[31mred\x1b[0m nul\x00 del\x7f"


@pytest.fixture(autouse=True)
def backend():
    """Once, not per kernel backend (conftest's): these test the web layer."""
    return "default"


@pytest.fixture
def path(tmp_path):
    p = str(tmp_path / "agent")
    with fastmem.open(p, embedder=None) as store:
        store.add("The user's name is Ada.", type="fact", pinned=True, timestamp=1e9)
        store.add_many(
            [
                {
                    "text": f"turn {i}: the deploy of service {i % 7} and the weather in city {i}",
                    "session": f"s{i // 40}",
                    "timestamp": 1e9 + 60 * (i + 1),
                }
                for i in range(130)
            ]
        )
    return p


def _client(path: str, *, readonly: bool = False, cookie: bool = True) -> TestClient:
    app = create_app(
        path, readonly=readonly, port=8765, secrets=Secrets(TOKEN, CSRF), embedder=None
    )
    client = TestClient(app, base_url=BASE, follow_redirects=False)
    if cookie:
        client.cookies.set(COOKIE, TOKEN)
    return client


@pytest.fixture
def client(path):
    with _client(path) as c:
        yield c


def _post(client: TestClient, **form: str):
    return client.post("/change", data={"csrf": CSRF, **form}, headers={"origin": BASE})


# --- security ----------------------------------------------------------------------------


ROUTES = [
    "/",
    "/overview/figures",
    "/timeline",
    "/memory/m1",
    "/search?q=deploy",
    "/context?q=deploy",
    "/api/pulse",
    "/static/ui.js",
    "/static/ui.css",
    "/add",
    "/verify",
]


@pytest.mark.parametrize("route", ROUTES)
def test_every_request_without_the_token_is_refused(path, route):
    with _client(path, cookie=False) as c:
        r = c.get(route)
        assert r.status_code == 403
        assert "token" in r.text and "Ada" not in r.text
        assert c.get(route + ("&" if "?" in route else "?") + "token=wrong").status_code == 403
        assert c.get(route, headers={"x-fastmem-token": "wrong"}).status_code == 403


def test_a_write_without_the_token_is_refused_and_changes_nothing(path):
    with _client(path, cookie=False) as c:
        r = c.post("/change", data={"csrf": CSRF, "action": "forget", "id": "m1", "confirm": "1"})
        assert r.status_code == 403
    with fastmem.open(path, readonly=True, embedder=None) as store:
        assert "m1" in store


def test_the_printed_address_sets_a_cookie_and_drops_the_token(path):
    with _client(path, cookie=False) as c:
        r = c.get(f"/timeline?before=m50&token={TOKEN}")
        assert r.status_code == 303
        assert r.headers["location"] == "/timeline?before=m50"
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}={TOKEN};")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        c.cookies.set(COOKIE, TOKEN)
        assert c.get("/timeline?before=m50").status_code == 200


def test_the_token_in_a_header_is_accepted(path):
    with _client(path, cookie=False) as c:
        assert c.get("/api/pulse", headers={"x-fastmem-token": TOKEN}).status_code == 200
        assert c.get("/api/pulse", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200


@pytest.mark.parametrize(
    "host", ["evil.example:8765", "127.0.0.1:9999", "localhost.evil.example:8765", ""]
)
def test_an_unknown_host_is_refused(client, host):
    """DNS rebinding: a page whose name now resolves to 127.0.0.1 sends its own Host."""
    r = client.get("/api/pulse", headers={"host": host})
    assert r.status_code == 421


@pytest.mark.parametrize("host", ["127.0.0.1:8765", "localhost:8765", "[::1]:8765"])
def test_the_loopback_names_are_accepted(client, host):
    assert client.get("/api/pulse", headers={"host": host}).status_code == 200


@pytest.mark.parametrize(
    "origin", ["http://evil.example", "null", "http://127.0.0.1:9999", "https://127.0.0.1:8765"]
)
def test_another_origin_is_refused(client, origin):
    assert client.get("/api/pulse", headers={"origin": origin}).status_code == 403
    r = client.post(
        "/change",
        data={"csrf": CSRF, "action": "forget", "id": "m1", "confirm": "1"},
        headers={"origin": origin},
    )
    assert r.status_code == 403
    assert client.get("/memory/m1").status_code == 200  # still there


def test_a_cross_site_request_is_refused(client):
    assert client.get("/", headers={"sec-fetch-site": "cross-site"}).status_code == 403
    assert client.get("/", headers={"sec-fetch-site": "same-origin"}).status_code == 200


@pytest.mark.parametrize("csrf", [None, "", "wrong"])
def test_a_write_needs_the_csrf_token(client, csrf):
    form = {"action": "forget", "id": "m1", "confirm": "1"}
    if csrf is not None:
        form["csrf"] = csrf
    r = client.post("/change", data=form, headers={"origin": BASE})
    assert r.status_code == 403
    assert client.get("/memory/m1").status_code == 200
    # With it, in the header: the change is made.
    r = client.post(
        "/change",
        data={"action": "forget", "id": "m1", "confirm": "1"},
        headers={"origin": BASE, "x-csrf-token": CSRF},
    )
    assert r.status_code == 303
    assert client.get("/memory/m1").status_code == 404


def test_pages_carry_the_security_headers_and_the_csrf_token(client):
    r = client.get("/")
    csp = r.headers["content-security-policy"]
    assert (
        "script-src 'self'" in csp
        and "frame-ancestors 'none'" in csp
        and "unsafe-inline" not in csp
    )
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["cache-control"] == "no-store"
    assert f'content="{CSRF}"' in r.text
    assert "<script>" not in r.text.replace('<script src="/static/ui.js" defer></script>', "")


def test_readonly_refuses_every_change(path):
    with _client(path, readonly=True) as c:
        page = c.get("/memory/m1").text
        assert "Change this memory" not in page and 'action="/change"' not in page
        assert c.get("/add").status_code == 403
        for action in ("pin", "forget", "add", "importance"):
            r = c.post(
                "/change",
                data={
                    "csrf": CSRF,
                    "action": action,
                    "id": "m1",
                    "confirm": "1",
                    "text": "x",
                    "value": "0.5",
                },
                headers={"origin": BASE},
            )
            assert r.status_code == 403
    with fastmem.open(path, readonly=True, embedder=None) as store:
        assert len(store) == 131 and not store.get("m1").pinned


def test_fastmem_ui_serves_on_loopback_with_a_token(path):
    """The real command: uvicorn on 127.0.0.1, the token in the printed address."""
    import httpx

    proc = subprocess.Popen(
        [sys.executable, "-m", "fastmem", "ui", path, "--port", "0", "--no-browser"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = ""
        while "token=" not in line:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
        url = re.search(r"http://\S+", line).group(0)
        assert url.startswith("http://127.0.0.1:")
        base = url.split("/?")[0]
        with httpx.Client() as h:
            for _ in range(100):
                try:
                    refused = h.get(base + "/")
                    break
                except httpx.ConnectError:
                    time.sleep(0.1)
            assert refused.status_code == 403
            opened = h.get(url, follow_redirects=True)
            assert opened.status_code == 200 and "Overview" in opened.text
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        proc.stdout.close()
        proc.stderr.close()


def test_a_missing_extra_is_named(monkeypatch):
    with pytest.raises(fastmem.DependencyUnavailableError, match=r"fastmem\[ui\]"):
        require((("starlette", "starlette"), ("no_such_module_for_fastmem_ui", "nosuch")))
    require(REQUIRES)


def test_fastmem_ui_without_the_extra_exits_6_naming_it(path):
    """As on a machine without Starlette: the command says what to install."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('starlette', 'uvicorn', 'jinja2'):\n"
        "            raise ImportError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from fastmem.cli import main\n"
        "sys.exit(main(['ui', sys.argv[1], '--no-browser']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, path], capture_output=True, text=True, check=False
    )
    assert done.returncode == 6, done.stderr
    assert "pip install 'fastmem[ui]'" in done.stderr and "starlette" in done.stderr


def test_import_fastmem_does_not_load_the_inspector():
    code = (
        "import sys, fastmem, fastmem.cli; print(sorted(m for m in sys.modules if "
        "m.startswith(('fastmem.ui', 'starlette', 'jinja2', 'uvicorn'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


# --- views -------------------------------------------------------------------------------


def test_overview(client, path):
    r = client.get("/")
    assert r.status_code == 200 and 'data-load="/overview/figures"' in r.text
    assert "131 memories" in r.text
    figures = client.get("/overview/figures").text
    assert 'data-testid="memories">131<' in figures and "conversation" in figures
    assert "<html" not in figures  # a fragment the page loads after it
    assert "intact" in client.get("/verify").text


def test_timeline_pages_by_cursor(client, path):
    first = client.get("/timeline").text
    ids = re.findall(r'class="row" data-id="(m\d+)"', first)
    with fastmem.open(path, readonly=True, embedder=None) as store:
        order = [m.id for m in store.recent(200)]
    assert ids == order[:50]
    cursor = re.search(r'id="more" data-next="(m\d+)"', first).group(1)
    assert cursor == order[49]
    second = client.get(f"/timeline?partial=1&before={cursor}").text
    assert re.findall(r'class="row" data-id="(m\d+)"', second) == order[50:100]
    assert "<html" not in second  # a fragment for the page's script
    last = client.get(f"/timeline?before={order[-2]}").text
    assert re.findall(r'class="row" data-id="(m\d+)"', last) == order[-1:]
    assert "The oldest memory." in last
    assert client.get("/timeline?before=m99999").status_code == 404


def test_memory_page(client):
    r = client.get("/memory/m0")
    assert r.status_code == 200 and "Ada" in r.text and 'data-testid="pinned"' in r.text
    assert client.get("/memory/m0?partial=1").text.lstrip().startswith("<section")
    assert client.get("/memory/m99999").status_code == 404
    assert client.get("/memory/not-an-id").status_code == 404


@pytest.mark.parametrize("mode", ["hybrid", "keyword"])
def test_search_shows_the_stores_hits_and_their_score_parts(client, path, mode):
    r = client.get("/search", params={"q": "deploy of service 3", "mode": mode, "k": "10"})
    shown = re.findall(r'<tr class="hit" data-id="(m\d+)"', r.text)
    with fastmem.open(path, readonly=True, embedder=None) as store:
        hits = store.search("deploy of service 3", 10, mode=mode)
    assert shown == [h.id for h in hits]
    assert "BM25" in r.text
    assert ("imp +" in r.text) == (mode == "hybrid")


def test_search_filters(client, path):
    r = client.get("/search", params={"q": "deploy", "session": "s1", "type": "conversation"})
    with fastmem.open(path, readonly=True, embedder=None) as store:
        wanted = [h.id for h in store.search("deploy", 20, session="s1", types=["conversation"])]
    assert re.findall(r'<tr class="hit" data-id="(m\d+)"', r.text) == wanted
    r = client.get("/search", params={"q": "deploy", "since": "2001-09-09", "until": "2001-09-09"})
    assert r.status_code == 200
    assert client.get("/search", params={"q": "x", "since": "yesterday"}).status_code == 400
    assert client.get("/search", params={"q": "x", "k": "100000"}).status_code == 400


def test_context_page_is_the_stores_context(client, path):
    r = client.get("/context", params={"q": "deploy of service 3", "budget": "200"})
    lines = re.findall(
        r'data-testid="context-line" data-id="(m\d+)" data-level="([^"]+)" data-tokens="(\d+)"',
        r.text,
    )
    with fastmem.open(path, readonly=True, embedder=None) as store:
        ctx = store.context("deploy of service 3", 200)
    names = {
        fastmem.Level.PINNED: "pinned",
        fastmem.Level.RECENT: "level 1",
        fastmem.Level.FOUND: "level 3",
    }
    assert sorted(lines) == sorted((i.id, names[i.level], str(i.tokens)) for i in ctx.items)
    assert f'data-tokens="{ctx.tokens}"' in r.text
    raw = re.search(r'<pre id="ctx-raw" class="fulltext">(.*?)</pre>', r.text, re.DOTALL).group(1)
    assert html.unescape(raw) == ctx.text
    data = client.get(
        "/context", params={"q": "deploy of service 3", "budget": "200", "format": "json"}
    ).json()
    assert data["text"] == ctx.text and data["tokens"] == ctx.tokens
    assert (
        "".join(s["text"] + "\n" for s in data["lines"]) == ctx.text + "\n"
    )  # every line, in order
    assert [i["id"] for i in data["left_out"]] == [i.id for i in ctx.left_out]
    assert client.get("/context", params={"q": "x", "budget": "0"}).status_code == 400


def test_context_lines_of_memories_holding_line_breaks(tmp_path):
    """A memory of several lines, and one whose text is one of those lines: each line of
    the page is its own memory's, and the lines put together are the context's text."""
    p = str(tmp_path / "s")
    with fastmem.open(p, embedder=None) as store:
        store.add("deploy log\nok\n## not a header", type="tool_result", timestamp=1e9 + 1)
        store.add("ok", timestamp=1e9 + 3)  # after it: its text stands inside the other's first
        store.add("deploy finished: ok", timestamp=1e9 + 2)
        ctx = store.context("deploy ok", 500)
    assert len(ctx.items) == 3
    with _client(p) as c:
        data = c.get(
            "/context", params={"q": "deploy ok", "budget": "500", "format": "json"}
        ).json()
    assert "\n".join(line["text"] for line in data["lines"]) == ctx.text
    shown = [line["item"]["id"] for line in data["lines"] if not line["header"]]
    assert sorted(shown) == sorted(i.id for i in ctx.items)
    headers = [line["text"] for line in data["lines"] if line["header"]]
    assert "## not a header" not in headers and all(h.startswith("## ") for h in headers)


def test_context_page_without_a_question_is_the_hot_restore(client, path):
    r = client.get("/context", params={"q": "", "budget": "300"})
    levels = re.findall(r'data-testid="context-line" data-id="m\d+" data-level="([^"]+)"', r.text)
    with fastmem.open(path, readonly=True, embedder=None) as store:
        ctx = store.context("", 300)
    assert sorted(levels) == sorted(
        {fastmem.Level.PINNED: "pinned", fastmem.Level.RECENT: "level 1"}[i.level]
        for i in ctx.items
    )
    assert "level 1" in levels and "pinned" in levels


def test_the_context_view_counts_no_access(client, path):
    with fastmem.open(path, readonly=True, embedder=None) as store:
        before = store.info("m5").access_count
    client.get("/context", params={"q": "deploy of service 4", "budget": "500"})
    with fastmem.open(path, readonly=True, embedder=None) as store:
        assert store.info("m5").access_count == before


def test_pulse_sees_another_handles_write(client, path):
    first = client.get("/api/pulse").json()
    with fastmem.open(path, embedder=None) as store:
        mid = store.add("written elsewhere", timestamp=2e9)
    now = client.get("/api/pulse").json()
    assert now["memories"] == first["memories"] + 1 and now["newest"] == mid
    assert mid in client.get("/timeline").text


def test_pulse_sees_pins_edits_and_forgets_of_another_process(client, path):
    """Not only adds: a write that keeps the count and the newest memory (a pin, an update, a
    forget followed by an add) changes the fingerprint the pages poll."""
    code = (
        "import fastmem, sys\n"
        "with fastmem.open(sys.argv[1], embedder=None) as s:\n"
        "    getattr(s, sys.argv[2])(*sys.argv[3:], **({'importance': 0.9} if sys.argv[2] == 'update' else {}))\n"
    )
    seen = [client.get("/api/pulse").json()]
    for args in (["pin", "m5"], ["update", "m6"], ["forget", "m7"]):
        subprocess.run([sys.executable, "-c", code, path, *args], check=True, timeout=60)
        now = client.get("/api/pulse").json()
        assert now != seen[-1], args
        seen.append(now)
    assert [p["newest"] for p in seen] == [seen[0]["newest"]] * 4  # no add among them
    assert seen[1]["memories"] == seen[2]["memories"] == seen[0]["memories"]
    assert seen[3]["memories"] == seen[0]["memories"] - 1
    assert client.get("/api/pulse").json() == seen[-1]  # no write, no change


def test_a_memory_page_refreshes_to_the_stores_state(client, path):
    """What the page's live refresh fetches: the section as the page shows it, or a 404."""
    section = client.get("/memory/m5?partial=page").text
    assert section.lstrip().startswith("<section") and "<html" not in section
    assert 'data-testid="pinned"' not in section and "<h2>m5</h2>" in section
    with fastmem.open(path, embedder=None) as store:
        store.pin("m5")
    assert 'data-testid="pinned"' in client.get("/memory/m5?partial=page").text
    with fastmem.open(path, embedder=None) as store:
        store.forget("m5")
    assert client.get("/memory/m5?partial=page").status_code == 404


def test_overview_shows_the_format_version_and_counts_by_session(client, path):
    figures = client.get("/overview/figures").text
    with fastmem.open(path, readonly=True, embedder=None) as store:
        version, sessions = store.stats().format_version, store.sessions()
    assert f'data-testid="format-version">version {version} ' in figures
    shown = re.findall(r'<tr data-session="([^"]*)"><td class="tname"><a href="([^"]*)">[^<]*</a>'
                       r'</td><td class="num">([\d,]+)</td>', figures)  # fmt: skip
    assert [(name, int(n)) for name, _, n in shown] == list(sessions.items())[:12]
    assert sessions == {"s3": 10, "s2": 40, "s1": 40, "s0": 40}  # newest activity first
    assert shown[0][1] == "/timeline?session=s3"


def test_overview_shows_twelve_sessions_and_says_how_many_more(tmp_path):
    path = str(tmp_path / "many")
    with fastmem.open(path, embedder=None) as store:
        store.add_many([{"text": f"t{i}", "session": f"<s{i}>"} for i in range(15)])
    with _client(path) as c:
        figures = c.get("/overview/figures").text
    assert re.findall(r'<tr data-session="([^"]*)"', figures) == [
        f"&lt;s{i}&gt;" for i in range(14, 2, -1)
    ]
    assert "and 3 more sessions" in figures


def test_timeline_of_one_session_pages_within_it(client, path):
    first = client.get("/timeline", params={"session": "s1"}).text
    ids = re.findall(r'class="row" data-id="(m\d+)"', first)
    with fastmem.open(path, readonly=True, embedder=None) as store:
        order = [m.id for m in store.recent(100, session="s1")]
    assert ids == order[:50] and len(order) == 40  # one page: no "more" button
    assert 'id="more"' not in first and "session s1" in first
    big = client.get("/timeline", params={"session": "s1"}).text
    assert 'data-refresh="/timeline?partial=1&amp;session=s1"' in big
    with fastmem.open(path, embedder=None) as store:
        store.add_many([{"text": f"more {i}", "session": "s1"} for i in range(30)])
        order = [m.id for m in store.recent(100, session="s1")]
    first = client.get("/timeline", params={"session": "s1"}).text
    more = html.unescape(re.search(r'data-url="([^"]+)"', first).group(1))
    assert more == f"/timeline?partial=1&session=s1&before={order[49]}"
    second = client.get(more).text
    assert re.findall(r'class="row" data-id="(m\d+)"', second) == order[50:]
    assert client.get("/timeline", params={"session": "x" * 300}).status_code == 400


def test_search_marks_superseded_hits(client, path):
    with fastmem.open(path, embedder=None) as store:
        old = store.add("the deploy window is Friday night", type="fact")
        new = store.add("the deploy window moved to Saturday morning", type="fact", supersedes=old)
    r = client.get("/search", params={"q": "deploy window", "mode": "keyword"})
    rows = {
        mid: bool(flag)
        for flag, mid in re.findall(r'<tr class="hit( superseded)?" data-id="(m\d+)"', r.text)
    }
    assert rows[old] is True and rows[new] is False
    assert f'data-superseded-by="{new}"' in r.text and "outdated · superseded by " + new in r.text


def test_a_memory_shows_its_supersedes_chain_both_ways(client, path):
    with fastmem.open(path, embedder=None) as store:
        a = store.add("Lisbon trip budget: 1,200 EUR in total.", type="fact")
        b = store.add("Lisbon trip budget: 1,500 EUR in total.", type="fact", supersedes=a)
        c = store.add("Lisbon trip budget: 1,800 EUR in total.", type="fact", supersedes=b)
    newer = {mid: re.findall(r'<li><a href="/memory/(m\d+)">', client.get(f"/memory/{mid}").text)
             for mid in (a, b, c)}  # fmt: skip
    assert newer == {a: [b, c], b: [c], c: []}
    for mid in (a, b, c):
        assert f'data-load="/memory/{mid}/older"' in client.get(f"/memory/{mid}").text
    older = {mid: re.findall(r'<li><a href="/memory/(m\d+)">', client.get(f"/memory/{mid}/older").text)
             for mid in (a, b, c)}  # fmt: skip
    assert older == {a: [], b: [a], c: [b, a]}
    assert "this memory supersedes" in client.get(f"/memory/{c}/older").text
    assert client.get("/memory/m99999/older").status_code == 404


def test_older_versions_end_at_a_forgotten_one(client, path):
    with fastmem.open(path, embedder=None) as store:
        a = store.add("the office wifi password is alpha", type="fact")
        b = store.add("the office wifi password is bravo", type="fact", supersedes=a)
        c = store.add("the office wifi password is charlie", type="fact", supersedes=b)
        store.forget(b)
    assert re.findall(r'href="/memory/(m\d+)"', client.get(f"/memory/{c}/older").text) == []
    newer = re.findall(r'<li><a href="/memory/(m\d+)">', client.get(f"/memory/{a}").text)
    assert newer == []  # the forward chain ends at the forgotten link too


def test_the_search_forms_types_follow_the_store_at_most_every_few_seconds(path, monkeypatch):
    from fastmem.ui import app as ui_app

    with _client(path) as c:
        assert '<option value="fact"' in c.get("/search").text
        with fastmem.open(path, embedder=None) as store:
            store.add("a new kind", type="recipe")
        assert '<option value="recipe"' not in c.get("/search").text  # read 0 s ago: kept
        monkeypatch.setattr(ui_app, "TYPES_EVERY", 0.0)
        assert '<option value="recipe"' in c.get("/search").text


def test_the_context_page_reports_its_parts_in_server_timing(client):
    timing = client.get("/context", params={"q": "deploy", "budget": "300"}).headers[
        "server-timing"
    ]
    parts = dict(re.findall(r"(\w+);dur=([\d.]+)", timing))
    assert {"context", "call", "thread", "total"} <= set(parts)
    assert float(parts["context"]) <= float(parts["call"]) <= float(parts["thread"])
    assert float(parts["thread"]) <= float(parts["total"])


@pytest.mark.parametrize("freeze", [False, True])
def test_freeze_heap_freezes_the_collector_once_warm(path, monkeypatch, freeze):
    import gc

    from fastmem.ui import app as ui_app

    calls = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))  # not in pytest's process
    app = ui_app.create_app(
        path, port=8765, secrets=Secrets(TOKEN, CSRF), embedder=None, freeze_heap=freeze
    )
    with TestClient(app, base_url=BASE):
        deadline = time.monotonic() + 30
        while freeze and not calls and time.monotonic() < deadline:
            time.sleep(0.01)
    assert calls == (["freeze"] if freeze else [])


# --- changes -----------------------------------------------------------------------------


def _confirm_then_apply(client, path, form: dict[str, str]):
    """The first post shows the confirmation and changes nothing; the second applies."""
    with fastmem.open(path, readonly=True, embedder=None) as store:
        before = list(store.recent(1000))
    r = _post(client, **form)
    assert r.status_code == 200 and 'data-testid="confirm"' in r.text
    with fastmem.open(path, readonly=True, embedder=None) as store:
        assert list(store.recent(1000)) == before
    r = _post(client, **form, confirm="1")
    assert r.status_code == 303, r.text
    return r.headers["location"]


def test_pin_unpin_importance_metadata(client, path):
    _confirm_then_apply(client, path, {"action": "pin", "id": "m7"})
    with fastmem.open(path, readonly=True, embedder=None) as store:
        assert store.get("m7").pinned
    _confirm_then_apply(client, path, {"action": "unpin", "id": "m7"})
    _confirm_then_apply(client, path, {"action": "importance", "id": "m7", "value": "0.75"})
    _confirm_then_apply(
        client, path, {"action": "metadata", "id": "m7", "value": '{"source": "ui"}'}
    )
    with fastmem.open(path, readonly=True, embedder=None) as store:
        m = store.get("m7")
    assert not m.pinned and m.importance == pytest.approx(0.75) and m.metadata == {"source": "ui"}


def test_forget_supersede_add(client, path):
    assert _confirm_then_apply(client, path, {"action": "forget", "id": "m9"}).startswith(
        "/timeline"
    )
    where = _confirm_then_apply(
        client, path, {"action": "supersede", "id": "m10", "text": "turn 9, corrected"}
    )
    new = where.split("/memory/")[1].split("?")[0]
    where = _confirm_then_apply(
        client,
        path,
        {
            "action": "add",
            "text": "line one\r\nline two",
            "type": "plan",
            "session": "ui",
            "importance": "0.4",
            "pinned": "1",
            "metadata": '{"k": [1, 2]}',
        },
    )
    added = where.split("/memory/")[1].split("?")[0]
    with fastmem.open(path, readonly=True, embedder=None) as store:
        assert "m9" not in store
        assert store.get("m10").metadata == {"superseded_by": new}
        m = store.get(added)
    assert (m.text, m.type, m.session, m.pinned, m.metadata) == (
        "line one\nline two",
        "plan",
        "ui",
        True,
        {"k": [1, 2]},
    )
    assert "superseded by " + new in client.get("/memory/m10").text


@pytest.mark.parametrize(
    "form",
    [
        {"action": "importance", "id": "m3", "value": "2"},
        {"action": "importance", "id": "m3", "value": "nan"},
        {"action": "metadata", "id": "m3", "value": "[1, 2]"},
        {"action": "metadata", "id": "m3", "value": "{not json"},
        {"action": "supersede", "id": "m3", "text": "  "},
        {"action": "add", "text": ""},
        {"action": "explode", "id": "m3"},
        {"action": "pin", "id": "m99999"},
    ],
)
def test_bad_changes_are_refused_and_change_nothing(client, path, form):
    with fastmem.open(path, readonly=True, embedder=None) as store:
        before = list(store.recent(1000))
    for confirm in ("0", "1"):
        r = _post(client, **form, confirm=confirm)
        assert r.status_code in (400, 404), r.text
    with fastmem.open(path, readonly=True, embedder=None) as store:
        assert list(store.recent(1000)) == before


# --- a hostile store ---------------------------------------------------------------------


@pytest.fixture
def hostile(tmp_path):
    p = str(tmp_path / "hostile")
    huge = ("A very long memory. " * 55_000)[:1_000_000]  # ~1 MB of text
    wide = "x" * 60_000  # one unbroken word
    keys = {
        f"k{i:04d}": i for i in range(6500)
    }  # > 100k characters as JSON (64 KiB packed is the limit)
    with fastmem.open(p, embedder=None) as store:
        ids = {
            "script": store.add(
                f"deploy note {SCRIPT} and {ATTR}",
                type="<b>bold</b>",
                session=f"<i>{SCRIPT}</i>",
                summary=SCRIPT,
                metadata={"html": SCRIPT},
            ),
            "controls": store.add(f"deploy controls {CONTROLS}", type="fact"),
            "huge": store.add(huge, type="document"),
            "wide": store.add(wide + " deploy", metadata={"wide": "y" * 50_000}),
            "keys": store.add("deploy keys", metadata=keys),
        }
    return p, ids


def _no_raw_markup(text: str) -> None:
    assert SCRIPT not in text
    assert "<img src=x" not in text
    assert "<b>bold</b>" not in text and "<i><script>" not in text
    # Control characters show as symbols, except in the context's raw text, kept exact for copying.
    shown = re.sub(r'<pre id="ctx-raw".*?</pre>', "", text, flags=re.DOTALL)
    assert "\x1b" not in shown and "\x00" not in shown and "\x07" not in shown


def test_a_hostile_store_renders_escaped_everywhere(hostile):
    p, ids = hostile
    with _client(p) as c:
        pages = [
            "/",
            "/timeline",
            "/search?q=deploy",
            "/search?q=deploy&mode=keyword",
            "/context?q=deploy+note&budget=3000",
            "/context?q=deploy&budget=50",
        ]
        pages += [f"/memory/{mid}" for mid in ids.values()] + [
            f"/memory/{mid}?partial=1" for mid in ids.values()
        ]
        for page in pages:
            r = c.get(page)
            assert r.status_code == 200, page
            _no_raw_markup(r.text)
        script = c.get(f"/memory/{ids['script']}").text
        assert "&lt;script&gt;alert(&#39;memory&#39;)&lt;/script&gt;" in script  # shown, as text
        controls = c.get(f"/memory/{ids['controls']}").text
        assert "\u241b[31mred" in controls and "\u2400" in controls and "\u2421" in controls
        timeline = c.get("/timeline").text
        assert len(timeline) < 100_000  # previews, not the megabyte
        huge = c.get(f"/memory/{ids['huge']}").text
        assert len(huge) > 1_000_000  # the whole memory on its own page
        keys = c.get(f"/memory/{ids['keys']}").text
        assert "k6499" in keys
        meta = re.search(r'<pre class="meta">(.*?)</pre>', keys, re.DOTALL).group(1)
        assert len(meta) > 100_000
        data = c.get(
            "/context", params={"q": "deploy note", "budget": "3000", "format": "json"}
        ).json()
        assert any(SCRIPT in line["text"] for line in data["lines"])  # JSON keeps the text as it is


def test_hostile_text_makes_no_element_or_attribute(hostile):
    """Parsed as a browser would: the pages' elements are the templates' own, whatever the
    memories hold (no <img>, <b>, <i> or second <script>, no on* attribute)."""
    from html.parser import HTMLParser

    class Elements(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[str] = []
            self.attrs: set[str] = set()

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            self.attrs.update(name for name, _ in attrs)

    p, ids = hostile
    with _client(p) as c:
        for page in [
            f"/memory/{ids['script']}",
            "/timeline",
            "/search?q=deploy+note",
            "/context?q=deploy+note&budget=3000",
        ]:
            parsed = Elements()
            parsed.feed(c.get(page).text)
            assert not {"img", "b", "i", "iframe"} & set(parsed.tags), page
            assert parsed.tags.count("script") == 1, page  # ui.js
            assert not [a for a in parsed.attrs if a.startswith("on")], page
        assert (
            "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in c.get(f"/memory/{ids['script']}").text
        )
