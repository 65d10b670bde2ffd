"""The ``fastmem`` command line: every subcommand, ``--json``, exit codes, one-line errors,
the export/import round trip and the demo, run in-process (``fastmem.cli.main``) and, where
the process boundary matters (tracebacks, the demo, the console entry), as subprocesses."""

from __future__ import annotations

import fcntl
import json
import math
import os
import subprocess
import sys

import pytest

import fastmem
from fastmem.cli import (EXIT_DAMAGED, EXIT_LOCKED, EXIT_NOT_FOUND, EXIT_OK, EXIT_PROBLEMS,
                         EXIT_USAGE, main)  # fmt: skip

SOURCE = os.path.dirname(os.path.dirname(fastmem.__file__))  # the fastmem under test


@pytest.fixture(autouse=True)
def backend():
    """The CLI (and its demo) exercises no kernel: one run, on the default kernels (the
    compiled ones when built), not one per backend as tests/conftest.py's fixture would."""
    yield fastmem.BACKEND


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys, *argv: str):
    code, out, err = cli(capsys, *argv, "--json")
    assert code == EXIT_OK, err
    return json.loads(out)


def one_error_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("fastmem: error: "), err
    assert "Traceback" not in err
    return err


def run_process(*argv: str, env_extra: dict[str, str] | None = None, **kwargs):
    env = {**os.environ, "PYTHONPATH": SOURCE, "FASTMEM_EMBEDDER": "none", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "fastmem", *argv], capture_output=True,
                          text=True, env=env, timeout=120, **kwargs)  # fmt: skip


LARGE = " ".join(f"{(i * 7919) % 100003:x}" for i in range(1500))


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "mem")
    with fastmem.open(path) as s:
        s.add("The user's dog is called Pixel.", type="fact", pinned=True, session="s1")
        s.add("Deploy the billing service on Friday.", type="plan", session="s1")
        s.add("weather_api: Lisbon 24°C, sunny", type="tool_result", session="s2")
        s.add(LARGE, session="s2")  # the largest record (it does not compress much)
        gone = s.add("Something to forget.")
        s.forget(gone)
    return path


# --- parsing and usage ------------------------------------------------------------------


def test_version_and_help(capsys):
    code, out, _ = cli(capsys, "--version")
    assert code == EXIT_OK and out.strip() == f"fastmem {fastmem.__version__}"
    code, out, _ = cli(capsys, "--help")
    assert code == EXIT_OK and "export" in out and "Exit codes" in out


@pytest.mark.parametrize("argv", [
    [], ["frobnicate"], ["stats"], ["search", "p"], ["search", "p", "  "],
    ["search", "p", "q", "-k", "0"], ["search", "p", "q", "-k", "ten"],
    ["search", "p", "q", "--mode", "psychic"], ["context", "p", "q", "--budget", "0"],
    ["stats", "p", "--namespace", "Alice"], ["stats", "p", "--namespace", "../x"],
    ["inspect", "p", "--largest", "0"], ["mcp"], ["hermes"], ["stats", "p", "--jsn"],
])  # fmt: skip
def test_usage_errors_are_one_line_exit_2(capsys, argv):
    code, out, err = cli(capsys, *argv)
    assert code == EXIT_USAGE and out == ""
    one_error_line(err)


# --- reading commands -------------------------------------------------------------------


def test_stats(capsys, store):
    stats = cli_json(capsys, "stats", store)
    assert stats["memories"] == 4 and stats["forgotten"] == 1 and stats["pinned"] == 1
    assert stats["types"] == {"conversation": 1, "fact": 1, "plan": 1, "tool_result": 1}
    assert stats["sessions"] == 2 and stats["dim"] == 0 and stats["with_vector"] == 0
    assert stats["dat_bytes"] == os.path.getsize(store + ".dat")
    assert stats["oldest"] <= stats["newest"]
    code, out, _ = cli(capsys, "stats", store + ".dat")  # either file name works too
    assert code == EXIT_OK and "tool_result 1" in out and "memories" in out


def test_inspect(capsys, store):
    m = cli_json(capsys, "inspect", store, "m0")
    stored = m.pop("stored")
    assert m == {"id": "m0", "text": "The user's dog is called Pixel.", "type": "fact",
                 "timestamp": m["timestamp"], "session": "s1", "importance": 0.9, "pinned": True,
                 "metadata": None, "summary": None}  # fmt: skip
    assert stored["record_offset"] == 64 and stored["record_bytes"] > 0  # the first record
    assert stored["text_tokens"] == 8 and stored["has_vector"] is False
    assert stored["access_count"] == 0 and stored["importance_score"] > 0.9  # pinned: a bonus
    largest = cli_json(capsys, "inspect", store, "--largest", "2")
    assert [r["id"] for r in largest] == ["m3", "m2"]
    assert largest[0]["record_bytes"] > largest[1]["record_bytes"]
    assert largest[0]["text_tokens"] > 1500 and largest[0]["record_bytes"] > len(LARGE) // 2
    code, out, _ = cli(capsys, "inspect", store, "m1")
    assert code == EXIT_OK and "Deploy the billing service" in out
    for argv, expected in ((["m4"], EXIT_NOT_FOUND), (["m99"], EXIT_NOT_FOUND),
                           (["banana"], EXIT_NOT_FOUND), ([], EXIT_USAGE),
                           (["m0", "--largest", "3"], EXIT_USAGE)):  # fmt: skip
        code, out, err = cli(capsys, "inspect", store, *argv)
        assert code == expected, argv
        one_error_line(err)


def test_search_and_context(capsys, store):
    hits = cli_json(capsys, "search", store, "billing Friday", "--mode", "keyword")
    assert [h["id"] for h in hits] == ["m1"] and hits[0]["score"] > 0
    hits = cli_json(capsys, "search", store, "dog Pixel", "-k", "1")  # hybrid
    assert [h["id"] for h in hits] == ["m0"]
    assert cli_json(capsys, "search", store, "Lisbon", "--session", "s1", "--mode", "keyword") == []
    assert cli_json(capsys, "search", store, "Lisbon", "--type", "fact", "--type", "plan") == []
    assert len(cli_json(capsys, "search", store, "Lisbon", "--type", "tool_result")) == 1
    code, out, _ = cli(capsys, "search", store, "Lisbon", "--mode", "keyword")
    assert code == EXIT_OK and "weather_api" in out and "m2" in out
    # No embedder (FASTMEM_EMBEDDER=none), no vectors: a vector search is a usage error.
    code, _, err = cli(capsys, "search", store, "dog", "--mode", "vector")
    assert code == EXIT_USAGE and "no embedder" in one_error_line(err)

    ctx = cli_json(capsys, "context", store, "When do we deploy billing?", "--budget", "60")
    assert ctx["tokens"] <= 60 and ctx["budget"] == 60 and "billing" in ctx["text"]
    assert {i["id"] for i in ctx["items"]} >= {"m1"}
    code, out, _ = cli(capsys, "context", store, "When do we deploy billing?")
    assert code == EXIT_OK and "Deploy the billing service on Friday." in out


def test_stored_text_is_shown_as_it_is(capsys, tmp_path):
    """Rich would read "[/x]" as a closing tag and ":smile:" as an emoji code."""
    path = str(tmp_path / "mem")
    text = "[/bold] oops [red]x[/red] :smile: [link"
    with fastmem.open(path) as s:
        s.add(text, type="[/t]", session="[/s]")
    for argv in (["stats"], ["inspect", "m0"], ["inspect", "--largest", "1"], ["search", "oops"],
                 ["context", "oops"]):  # fmt: skip
        code, out, err = cli(capsys, argv[0], path, *argv[1:])
        assert code == EXIT_OK and err == "", (argv, err)
        assert "[/t]" in out, argv
        if argv[0] != "stats":
            assert "oops" in out and ":smile:" in out and "[red]x[/red]" in out.replace("\n", ""), argv


def test_reading_commands_work_while_a_writer_holds_the_store(capsys, store):
    with fastmem.open(store) as writer:
        writer.add("Added while the CLI reads.")
        writer.flush()
        assert cli_json(capsys, "stats", store)["memories"] == 5
        assert cli_json(capsys, "verify", store)["ok"] is True
        assert cli_json(capsys, "search", store, "CLI reads", "--mode", "keyword")[0]["id"] == "m5"


def test_missing_and_damaged_stores(capsys, tmp_path):
    missing = str(tmp_path / "nothing")
    for argv in (["stats"], ["verify"], ["repair"], ["compact"], ["export"], ["inspect", "--largest", "1"]):
        code, _, err = cli(capsys, argv[0], missing, *argv[1:])
        assert code == EXIT_NOT_FOUND, argv
        assert "no fastmem store" in one_error_line(err)
    assert not os.path.exists(missing + ".dat")  # nothing was created by looking
    junk = tmp_path / "junk"
    (tmp_path / "junk.dat").write_bytes(b"this is not a fastmem data file at all" * 10)
    for argv in (["stats"], ["verify"], ["compact"]):
        code, _, err = cli(capsys, argv[0], str(junk))
        assert code == EXIT_DAMAGED, argv
        assert "fastmem repair PATH" in one_error_line(err)


# --- integrity and maintenance ------------------------------------------------------------


def test_verify_repair_and_exit_codes(capsys, tmp_path):
    path = str(tmp_path / "mem")
    with fastmem.open(path) as s:
        s.add_many([{"text": f"memory number {i} about topic {i % 7}"} for i in range(40)])
    report = cli_json(capsys, "verify", path)
    assert report["ok"] is True and report["problems"] == [] and report["records"] == 40
    with open(path + ".dat", "r+b") as f:  # flip a byte inside a record in the middle
        f.seek(os.path.getsize(path + ".dat") // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    code, out, err = cli(capsys, "verify", path, "--json")
    report = json.loads(out)
    assert code == EXIT_PROBLEMS and report["ok"] is False and err == ""
    assert report["problems"] and report["problems"][0]["file"] == "dat"
    code, out, _ = cli(capsys, "verify", path)
    assert code == EXIT_PROBLEMS and "fastmem repair" in out

    code, out, err = cli(capsys, "repair", path, "--json")
    repaired = json.loads(out)
    assert code == EXIT_PROBLEMS and repaired["ok"] is False  # data had to be cut
    assert repaired["memories"] == 39 and repaired["cut_bytes"] > 0
    assert os.path.exists(repaired["damaged_path"])
    assert "Traceback" not in err
    assert cli_json(capsys, "verify", path)["ok"] is True
    code, out, _ = cli(capsys, "repair", path)  # nothing left to cut
    assert code == EXIT_OK and "nothing damaged" in out


def test_every_missing_dependency_exits_6(capsys, tmp_path, monkeypatch):
    """The "not installed" errors share one base the CLI maps (the MCP server's error is
    fastmem's own, still importable where it was)."""
    from fastmem.cli import EXIT_MISSING, exit_code
    from fastmem.errors import DependencyUnavailableError
    from fastmem.integrations import mcp_server

    assert mcp_server.McpUnavailableError is fastmem.errors.McpUnavailableError
    for error in (fastmem.EmbedderUnavailableError, fastmem.EncodingUnavailableError,
                  mcp_server.McpUnavailableError):  # fmt: skip
        assert issubclass(error, DependencyUnavailableError) and not issubclass(error, ImportError)
        assert exit_code(error("x")) == EXIT_MISSING

    def no_sdk(name: str):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(mcp_server.importlib, "import_module", no_sdk)
    code, _, err = cli(capsys, "mcp", "--store", str(tmp_path / "mem"))
    assert code == EXIT_MISSING and "pip install 'fastmem[mcp]'" in one_error_line(err)
    assert not os.path.exists(tmp_path / "mem.dat")  # refused before opening the store


def test_compact(capsys, tmp_path):
    path = str(tmp_path / "mem")
    with fastmem.open(path) as s:
        ids = s.add_many([{"text": f"note {i} " + "filler " * 50} for i in range(100)])
        for mid in ids[:60]:
            s.forget(mid)
    report = cli_json(capsys, "compact", path)
    assert report["memories"] == 40 and report["dropped"] == 60
    assert report["reclaimed"] > 0 and report["bytes_after"] < report["bytes_before"]
    assert cli_json(capsys, "stats", path)["forgotten"] == 0
    code, out, _ = cli(capsys, "compact", path)
    assert code == EXIT_OK and "40 memories kept" in out


def test_recovery_warnings_are_one_line(capsys, store):
    os.remove(store + ".idx")  # a lost index: rebuilt from the data file, with a warning
    code, out, err = cli(capsys, "compact", store, "--json")
    assert code == EXIT_OK and json.loads(out)["memories"] == 4
    assert err.count("\n") == 1 and err.startswith("fastmem: warning: fastmem rebuilt the index")


def test_writing_commands_work_beside_a_writer_and_wait_for_a_held_lock(capsys, store, tmp_path):
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"text": "hello"}\n')
    with fastmem.open(store) as other:  # another writer has the store open: no refusal
        for argv in (["import", store, str(lines)], ["compact", store], ["repair", store]):
            code, _, err = cli(capsys, *argv)
            assert code == 0, (argv, err)
        assert "hello" in [m.text for m in other]  # the other handle follows at once
    holder = os.open(store + ".dat", os.O_RDWR)  # a lock held for longer than any write
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        for argv in (["repair", store], ["compact", store], ["import", store, str(lines)]):
            code, _, err = cli(capsys, *argv, "--timeout", "0.05")
            assert code == EXIT_LOCKED, argv
            assert "locked for writing" in one_error_line(err)
    finally:
        os.close(holder)


# --- export and import ------------------------------------------------------------------


def _fields(memory: fastmem.Memory) -> tuple:
    return memory[1:]  # every field but the id (a store numbers its own memories)


def test_export_import_round_trip(capsys, tmp_path):
    src = str(tmp_path / "src")
    # summarizer=None: the long text below has no summary, and must not get one on import.
    with fastmem.open(src, summarizer=None) as s:
        s.add("Grüße aus Köln — 東京で会いましょう 🎉 \"quoted\" \\ back\nslash\ttab",
              type="conversation", session="sessión-1", timestamp=1_700_000_000.123456)
        s.add("The user prefers tea.", type="fact", pinned=True, importance=0.95,
              metadata={"source": "chat", "n": 3, "ratio": 0.1, "nested": {"list": [1, "二", None, True]},
                        "blob": b"\x00\xffbytes", "empty": {}, "inf": math.inf})
        s.add("A long note " + "about many things. " * 200, type="my-own-type", importance=0.0)
        s.add("Summarised tool output", type="tool_result", summary="a summary given by hand",
              metadata={"tool": "search"})
        gone = s.add("This one is forgotten and must not be exported.")
        s.forget(gone)
        changed = s.add("Changed after writing.", session="s")
        s.update(changed, importance=0.42, metadata={"v": 2})
        s.pin(changed)
        s.add("plain")
        original = [_fields(m) for m in s]
    assert original[2][7] is None  # no summary: the check below means something

    dump = tmp_path / "dump.jsonl"
    code, out, err = cli(capsys, "export", src, "-o", str(dump))
    assert code == EXIT_OK and out == "" and "exported 6 memories" in err
    lines = dump.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 6 and "forgotten" not in dump.read_text(encoding="utf-8")
    assert "東京" in lines[0]  # UTF-8, not \u escapes
    code, out, _ = cli(capsys, "export", src)  # to stdout: the same lines
    assert code == EXIT_OK and out.splitlines() == lines

    dst = str(tmp_path / "dst")
    result = cli_json(capsys, "import", dst, str(dump))
    assert result["imported"] == 6 and result["first_id"] == "m0" and result["last_id"] == "m5"
    with fastmem.open(dst, readonly=True) as d:
        assert [_fields(m) for m in d] == original

    # Exporting the copy gives the same lines, ids aside; a second import appends.
    code, out, _ = cli(capsys, "export", dst)
    strip = [{k: v for k, v in json.loads(line).items() if k != "id"} for line in lines]
    assert [{k: v for k, v in json.loads(line).items() if k != "id"} for line in out.splitlines()] == strip
    assert cli_json(capsys, "import", dst, str(dump))["first_id"] == "m6"


def test_import_links_a_superseded_memory_to_the_new_id_of_its_successor(capsys, tmp_path):
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    with fastmem.open(dst, embedder=None) as d:  # the copy's ids differ from src's
        d.add_many([{"text": "Already here."}, {"text": "Here too."}])
    with fastmem.open(src, embedder=None) as s:
        s.forget(s.add("Forgotten: not exported."))
        old = s.add("The user lives in Paris.", type="fact", metadata={"source": "chat"})
        other = s.add("The office is on floor 2.", type="fact")
        new = s.add("The user moved to Berlin.", type="fact", supersedes=old)
        s.forget(s.add("Floor 5 now.", type="fact", supersedes=other))  # a link to a memory not exported
    # Imported as is, Paris's link would name the office (m3 in the copy), a live newer memory.
    dump = tmp_path / "dump.jsonl"
    assert cli(capsys, "export", src, "-o", str(dump))[0] == EXIT_OK
    assert f'"superseded_by": "{new}"' in dump.read_text()
    assert cli_json(capsys, "import", dst, str(dump))["imported"] == 3
    with fastmem.open(dst, embedder=None) as d:
        by_text = {m.text: m for m in d}
        paris, berlin = by_text["The user lives in Paris."], by_text["The user moved to Berlin."]
        assert berlin.id != new
        assert paris.metadata == {"source": "chat", "superseded_by": berlin.id}
        assert by_text["The office is on floor 2."].metadata is None
        ids = [i.id for i in d.context("user lives Paris", budget=100).items]
        assert berlin.id in ids and paris.id not in ids


def test_import_ignores_links_that_are_not_ids(capsys, tmp_path):
    dump = tmp_path / "dump.jsonl"
    dump.write_text('{"id": [1], "text": "a", "metadata": {"superseded_by": [2], "k": 1}}\n'
                    '{"id": "m1", "text": "b", "metadata": {"superseded_by": {"x": 1}}}\n')  # fmt: skip
    assert cli_json(capsys, "import", str(tmp_path / "dst"), str(dump))["imported"] == 2
    with fastmem.open(str(tmp_path / "dst"), embedder=None, readonly=True) as d:
        assert [m.metadata for m in d] == [{"k": 1}, None]


def test_export_import_vectors(capsys, tmp_path):
    """export --vectors keeps embeddings given with add(embedding=...): import uses them
    (a keyword-only store here, so nothing could embed them again)."""
    import numpy as np

    rng = np.random.default_rng(7)
    src = str(tmp_path / "src")
    with fastmem.open(src) as s:
        with_vec = s.add_many([{"text": f"vector memory {i}", "embedding": rng.normal(size=8)}
                               for i in range(5)])  # fmt: skip
        without = s.add("no vector here")
        stored = {mid: s.vector(mid) for mid in with_vec}
        assert s.vector(without) is None
        for v in stored.values():
            assert v.dtype == np.float32 and v.shape == (8,) and abs(np.linalg.norm(v) - 1) < 1e-2
        query = stored[with_vec[3]]
        assert s.search(query, 1)[0].id == with_vec[3]
    dump = tmp_path / "dump.jsonl"
    assert cli(capsys, "export", src, "--vectors", "-o", str(dump))[0] == EXIT_OK
    rows = [json.loads(line) for line in dump.read_text().splitlines()]
    assert [r["embedding"] is None for r in rows] == [False] * 5 + [True]
    code, out, _ = cli(capsys, "export", src)
    assert code == EXIT_OK and "embedding" not in out  # only when asked for

    dst = str(tmp_path / "dst")
    assert cli_json(capsys, "import", dst, str(dump))["imported"] == 6
    with fastmem.open(dst, readonly=True) as d:
        for old, new in zip(with_vec, [m.id for m in d][:5]):
            np.testing.assert_allclose(d.vector(new), stored[old], atol=1e-3)
        assert d.vector("m5") is None
        assert d.search(query, 1)[0].id == "m3"  # vector search works on the copy
        with pytest.raises(fastmem.UnknownMemoryError):
            d.vector("m99")

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a", "embedding": [1, 0, 0]}\n{"text": "b", "embedding": [1, 0]}\n')
    code, _, err = cli(capsys, "import", str(tmp_path / "dst2"), str(bad))
    assert code == EXIT_USAGE and "line 2" in one_error_line(err) and "length 2" in err


def test_import_into_a_namespace_from_stdin(capsys, tmp_path, monkeypatch):
    import io

    root = str(tmp_path / "root")
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"text": "alice likes jazz"}\n\n{"text": "b", "pinned": null}\n'))
    assert cli_json(capsys, "import", root, "-", "--namespace", "alice")["imported"] == 2
    assert cli_json(capsys, "stats", root, "--namespace", "alice")["memories"] == 2
    code, _, err = cli(capsys, "stats", root, "--namespace", "bob")
    assert code == EXIT_NOT_FOUND
    one_error_line(err)
    assert fastmem.namespaces.list_namespaces(root) == ["alice"]
    code, _, err = cli(capsys, "stats", root)  # the root itself is no store: say what is there
    assert code == EXIT_NOT_FOUND and "holds namespaced stores (alice): add --namespace" in one_error_line(err)


@pytest.mark.parametrize("content, code, message", [
    ('{"text": "ok"}\nnot json\n', EXIT_USAGE, "line 2: not valid JSON"),
    ('["a list"]\n', EXIT_USAGE, "line 1: expected a JSON object"),
    ('{"text": "ok", "colour": "red"}\n', EXIT_USAGE, "line 1: unknown fields ['colour']"),
    ('{"type": "fact"}\n', EXIT_USAGE, "line 1: no 'text'"),
    ('{"text": "a"}\n{"text": "b", "importance": 7}\n', EXIT_USAGE, "line 2: importance must be"),
    ('{"text": "a", "metadata": {"$bytes": "%%%"}}\n', EXIT_USAGE, "bad $bytes value"),
    ('{"text": "a", "pinned": "yes"}\n', EXIT_USAGE, "pinned must be True or False"),
])  # fmt: skip
def test_import_rejects_bad_files(capsys, tmp_path, content, code, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content, encoding="utf-8")
    dst = str(tmp_path / "dst")
    got, _, err = cli(capsys, "import", dst, str(bad))
    assert got == code
    assert message in one_error_line(err), err
    if os.path.exists(dst + ".dat"):  # nothing of a bad file is imported
        with fastmem.open(dst, readonly=True) as d:
            assert len(d) == 0


def test_import_missing_or_binary_file(capsys, tmp_path):
    code, _, err = cli(capsys, "import", str(tmp_path / "dst"), str(tmp_path / "nope.jsonl"))
    assert code == EXIT_NOT_FOUND and "nope.jsonl" in one_error_line(err)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    code, _, err = cli(capsys, "import", str(tmp_path / "dst"), str(binary))
    assert code == EXIT_USAGE and "not UTF-8" in one_error_line(err)
    code, _, err = cli(capsys, "import", str(tmp_path / "dst"), str(tmp_path))
    assert code == EXIT_USAGE and "directory" in one_error_line(err)


# --- processes: no tracebacks, quiet pipes, the demo ------------------------------------------


def test_errors_in_a_real_process_are_one_line(tmp_path, store):
    proc = run_process("stats", str(tmp_path / "missing"))
    assert proc.returncode == EXIT_NOT_FOUND and proc.stdout == ""
    one_error_line(proc.stderr)
    proc = run_process("search", store, "x", "-k", "-3")
    assert proc.returncode == EXIT_USAGE
    one_error_line(proc.stderr)
    # Success in a pipe: data on stdout, nothing on stderr (no progress bar outside a terminal).
    proc = run_process("export", store)
    assert proc.returncode == EXIT_OK and proc.stderr == "" and len(proc.stdout.splitlines()) == 4
    proc = run_process("import", str(tmp_path / "copy"), "-", input=proc.stdout)
    assert proc.returncode == EXIT_OK and proc.stderr == "", proc.stderr
    assert "imported 4 memories" in proc.stdout


def test_hermes_install(capsys, tmp_path):
    pytest.importorskip("yaml")  # the activation below is checked by parsing the file
    import yaml

    home = tmp_path / "hermes"
    result = cli_json(capsys, "hermes", "install", "--hermes-home", str(home))
    plugin = home / "plugins" / "fastmem"
    assert result["plugin_dir"] == str(plugin) and not result["activated"]
    assert "def register(ctx)" in (plugin / "__init__.py").read_text()
    assert "name: fastmem" in (plugin / "plugin.yaml").read_text()
    assert "provider: fastmem" in result["message"] and not (home / "config.yaml").exists()

    (home / "config.yaml").write_text("model:\n  default: gpt-x\nmemory:\n  provider: honcho\n")
    code, out, err = cli(capsys, "hermes", "install", "--hermes-home", str(home), "--activate")
    assert code == EXIT_OK and "Activated" in out, err
    config = yaml.safe_load((home / "config.yaml").read_text())
    assert config == {"model": {"default": "gpt-x"}, "memory": {"provider": "fastmem"}}

    (home / "config.yaml").write_text("- not a mapping\n")  # refused, and left as it was
    code, out, err = cli(capsys, "hermes", "install", "--hermes-home", str(home), "--activate")
    assert code == EXIT_USAGE and "config.yaml" in one_error_line(err)
    assert (home / "config.yaml").read_text() == "- not a mapping\n"


def test_demo_end_to_end(tmp_path):
    path = tmp_path / "demo_store"
    proc = run_process("demo", "--json", "--path", str(path))
    assert proc.returncode == EXIT_OK, proc.stderr
    result = json.loads(proc.stdout)
    written, restart, ctx = result["written"], result["restart"], result["context"]
    assert written["keywords_only"] == "FASTMEM_EMBEDDER=none" and written["embedder"] is None
    assert restart["memories"] == written["memories"] > 100
    assert restart["open_seconds"] < 1.0 and len(restart["recent"]) == 6
    assert restart["recent"][0]["text"] == "You're welcome! I'll pick up the bookings next time."
    assert result["preload"]["done"] == result["preload"]["total"] > 0
    assert 0 < ctx["tokens"] == ctx["recount"] <= ctx["budget"] == 1300
    assert ctx["answer_found"] and "Ana is getting married in Porto" in ctx["text"]
    assert "The user is allergic to cashews" in ctx["text"] and ctx["levels"]["0"] == 1
    assert ctx["verify_ok"] is True
    with fastmem.open(str(path), readonly=True) as s:  # the store stays where asked
        assert len(s) == written["memories"]

    proc = run_process("demo", "--path", str(path))  # it never writes into an existing store
    assert proc.returncode == EXIT_USAGE and "already exists" in one_error_line(proc.stderr)

    proc = run_process("demo")  # the people's version: rich text, a temporary store
    assert proc.returncode == EXIT_OK, proc.stderr
    assert "keywords only" in proc.stdout and "contains m" in proc.stdout
    assert "tokens (exact, tiktoken)" in proc.stdout and "Traceback" not in proc.stderr


def test_a_failed_demo_process_is_one_line_exit_1(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")  # every child exits 1, printing nothing
    code, _, err = cli(capsys, "demo", "--path", str(tmp_path / "demo_store"))
    assert code == EXIT_PROBLEMS
    assert one_error_line(err) == "fastmem: error: a process of the demo failed: exit status 1\n"


def test_the_demo_does_not_import_the_cli():
    """cli imports _demo to run it; the other way round (even inside a function) is a circle."""
    import ast

    from fastmem.cli import demo as _demo

    with open(_demo.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported = {(node.level, node.module) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {(0, alias.name) for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert (1, "cli") not in imported and (0, "fastmem.cli") not in imported, imported


def test_demo_search_and_context_with_the_model(tmp_path):
    """The Quickstart's path: the real embedder, the int8 model that ships in the package (it
    used to skip without the float32 model, which the demo does not use)."""
    path = str(tmp_path / "demo_store")
    env = {"FASTMEM_EMBEDDER": "default"}
    proc = run_process("demo", "--json", "--path", path, env_extra=env)
    assert proc.returncode == EXIT_OK, proc.stderr
    result = json.loads(proc.stdout)
    assert result["written"]["keywords_only"] is None and "MiniLM" in result["written"]["embedder"]
    ctx = result["context"]
    assert ctx["degraded"] is False and ctx["answer_found"] and ctx["tokens"] == ctx["recount"] <= 1300
    # The CLI waits for the model before a search (no degraded answers on a command line).
    proc = run_process("search", path, "my sister's marriage ceremony", "--mode", "vector", "-k", "3",
                       "--json", env_extra=env)  # fmt: skip
    assert proc.returncode == EXIT_OK, proc.stderr
    hits = json.loads(proc.stdout)
    assert any("Ana is getting married" in h["text"] for h in hits)
    proc = run_process("context", path, "what did I say about my sister?", "--json", env_extra=env)
    assert proc.returncode == EXIT_OK and json.loads(proc.stdout)["degraded"] is False
    stats = json.loads(run_process("stats", path, "--json").stdout)
    assert stats["dim"] == 384 and stats["with_vector"] == stats["memories"]


def _stderr_on_a_terminal(*argv: str) -> tuple[int, str]:
    """Run the CLI with its stderr on a pseudo-terminal; returns (exit code, what it drew)."""
    pty = pytest.importorskip("pty")
    master, slave = pty.openpty()
    try:
        env = {**os.environ, "PYTHONPATH": SOURCE, "FASTMEM_EMBEDDER": "none", "COLUMNS": "100"}
        proc = subprocess.run([sys.executable, "-m", "fastmem", *argv], stdout=subprocess.PIPE,
                              stderr=slave, env=env, timeout=120)  # fmt: skip
        os.close(slave)
        slave = -1
        drawn = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            drawn += chunk
        return proc.returncode, drawn.decode("utf-8", "replace")
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


def test_progress_bars_only_on_a_terminal_and_never_with_json(tmp_path):
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(json.dumps({"text": f"memory {i}"}) + "\n" for i in range(3000)))
    code, drawn = _stderr_on_a_terminal("import", str(tmp_path / "a"), str(lines))
    assert code == EXIT_OK and "importing" in drawn and "3000" in drawn
    code, drawn = _stderr_on_a_terminal("import", str(tmp_path / "b"), str(lines), "--json")
    assert code == EXIT_OK and drawn == ""


def test_reembed_gives_a_keyword_only_store_the_default_models_vectors(capsys, tmp_path):
    from fastmem.embed import default_embedder

    path = str(tmp_path / "kw")
    with fastmem.open(path, embedder=None) as s:
        ids = s.add_many([{"text": "The user adopted a grey cat called Miso."},
                          {"text": "Deploys go out on Tuesdays."}])  # fmt: skip
        assert s.stats().with_vector == 0
    code, out, err = cli(capsys, "reembed", path, "--json")
    assert code == 0, err
    report = json.loads(out)
    model = default_embedder()
    assert (report["memories"], report["embedder"], report["dim"]) == (2, model.name, model.dim)
    with fastmem.open(path, embedder=model) as s:  # the store now belongs to the default model
        assert s.stats().with_vector == 2 and s.verify().ok
        hit = s.search("what pet does the user have", k=1, mode="vector")[0]
        assert hit.id == ids[0]


def test_every_lock_wait_defaults_to_the_one_constant(monkeypatch):
    """The CLI's --timeout (write commands and mcp) and the Hermes writer's wait for the
    lock are fastmem.LOCK_TIMEOUT, the store's own default, not copies of its value."""
    from fastmem import cli
    from fastmem.integrations import _writer

    parser = cli.build_parser()
    for argv in (["compact", "s"], ["repair", "s"], ["import", "s", "f"], ["mcp", "--store", "s"]):
        assert parser.parse_args(argv).timeout is fastmem.LOCK_TIMEOUT
    assert _writer.WRITE_WAIT is fastmem.LOCK_TIMEOUT
    assert fastmem.open.__kwdefaults__["timeout"] is fastmem.LOCK_TIMEOUT
