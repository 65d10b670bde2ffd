"""Search and supersedes: a hybrid search lists the newest truth first.

A memory replaced by a newer one (``add``'s ``supersedes``) stays findable (search keeps the
history), but a hybrid search ranked it above its replacement whenever its words matched the
question better ("lives in Paris" for "where does the user live", above "moved to Berlin"):
an agent reading the hits took the old fact for the current one. The newest version now takes
the old one's place and the old one follows it, as a context shows the newest version in the
old one's place. Vector and keyword searches report raw scores and are left as they rank.
"""

from __future__ import annotations

import fastmem
from fastmem import embed


def _open(path: str, **options):
    return fastmem.open(path, embedder=None, summarizer=None, **options)


def _paris_then_berlin(store):
    paris = store.add("The user lives in Paris.", type="fact")
    store.add("The user likes green tea.", type="fact")
    berlin = store.add("The user moved to Berlin in May.", type="fact", supersedes=paris)
    return paris, berlin


def test_hybrid_search_lists_the_newer_memory_before_the_one_it_replaces(store_path):
    with _open(store_path) as store:
        paris, berlin = _paris_then_berlin(store)
        # Keyword scores alone rank the old fact first: "lives" matches the question.
        raw = [h.id for h in store.search("where does the user live", mode="keyword")]
        assert raw.index(paris) < raw.index(berlin)
        hits = store.search("where does the user live")
        ids = [h.id for h in hits]
        assert ids[:2] == [berlin, paris]
        assert hits[0].superseded_by is None and hits[1].superseded_by == berlin
        assert hits[0].score == hits[1].score  # the newer one in the old one's place
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert len(ids) == len(set(ids))


def test_a_newer_memory_that_matches_nothing_comes_in_the_old_ones_place(store_path):
    with _open(store_path) as store:
        paris, berlin = _paris_then_berlin(store)
        hits = store.search("Paris", k=5)
        assert [h.id for h in hits][:2] == [berlin, paris]
        assert hits[0].keyword is None  # brought in by the link, not by the query's words
        # Only k hits, the newer one first.
        assert [h.id for h in store.search("Paris", k=1)] == [berlin]
        # Raw modes report what matched, as they rank it.
        assert [h.id for h in store.search("Paris", mode="keyword")] == [paris]


def test_a_newer_memory_the_filters_leave_out_is_not_brought_in(store_path):
    with _open(store_path) as store:
        old = store.add("Standup is at 9:00 on Mondays.", type="note", session="team")
        new = store.add("Standup is at 9:30 now.", type="fact", session="team", supersedes=old)
        assert [h.id for h in store.search("standup Mondays", types=["note"])] == [old]
        assert [h.id for h in store.search("standup Mondays", session="other")] == []
        assert [h.id for h in store.search("standup Mondays")] == [new, old]


def test_a_chain_lists_its_newest_live_version_first(store_path):
    with _open(store_path) as store:
        first = store.add("The deadline is March 3.", type="fact")
        second = store.add("The deadline is March 10.", type="fact", supersedes=first)
        third = store.add("It moved to April.", type="fact", supersedes=second)
        ids = [h.id for h in store.search("deadline March")]
        assert ids == [third, first, second] or ids == [third, second, first]
        assert ids[0] == third
        store.forget(third)  # a forgotten version ends the chain: the last live one
        ids = [h.id for h in store.search("deadline March")]
        assert ids[0] == second and set(ids) == {first, second}


def test_hybrid_search_with_the_real_embedder_puts_berlin_first(store_path):
    with fastmem.open(store_path, embedder=embed.default_embedder()) as store:
        paris, berlin = _paris_then_berlin(store)
        store.add("The user's sister is called Maria.", type="fact")
        for question in ("Where does the user live?", "user's city"):
            ids = [h.id for h in store.search(question, k=3)]
            assert ids.index(berlin) < ids.index(paris)
