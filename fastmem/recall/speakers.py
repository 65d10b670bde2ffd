"""Whose question it is: the speakers of a conversation a question names among its best
matches (:func:`named_speakers`), the conversations they are in (:func:`their_sessions`), and
the question without their names (:func:`without_names`), which a second ranking embeds.
Part of the ranking: the packer receives the speakers found here in a
:class:`~fastmem.recall.hits.Ranking`.
"""

from __future__ import annotations

import re

from ..storage.engine import Engine
from ..storage.index import MemoryIndex
from .hits import WORD, Ranked, speaker_of
from .ranking import NO_FILTERS

# The best matches whose speakers may be the query's subject.
SPEAKER_ROWS = 16
# A question holding one of these words is asked in the first person: about the user's own
# messages (those starting ``USER_PREFIX``, the chat role's name, in any case).
FIRST_PERSON = frozenset({"i", "me", "my", "mine", "myself"})
USER_PREFIX = "user: "


def named_speakers(engine: Engine, ranked: list[Ranked], query: str) -> frozenset[str] | None:
    """The speaker prefixes (``"Melanie: "``) of ``ranked`` whose name the query holds as a
    word, written the same way and capitalised (a person, not a role like ``user``); for a
    question in the first person with none named, the user's (``"user: "``, any case);
    ``None`` when there is none. Only conversation turns have speakers (:func:`~fastmem.recall.hits.speaker_of`).

    In a conversation between people, a question about one of them ("What does Melanie do
    to relax?") is answered by that person's own turns, while search alone also ranks the
    other speaker's replies next to them (they share the words) and the turns around them.
    A question in the first person ("When did I say the deadline was?") is the user asking
    what they said or did: their own messages hold it, not the assistant's replies that
    repeat its words.
    """
    words = set(WORD.findall(query))
    first_person = not FIRST_PERSON.isdisjoint(w.lower() for w in words)
    named = set()
    user = set()
    for hit in ranked:
        m = speaker_of(engine.cached_memory(hit.row))
        if m and m.group(0)[:1].isupper() and m.group(0)[:-2] in words:
            named.add(m.group(0))
        elif m and first_person and m.group(0).lower() == USER_PREFIX:
            user.add(m.group(0))
    if not named:
        named = user
    return frozenset(named) or None


# A name held by more memories than this is too common to tell conversations apart (and
# looking up every session it is in would cost more than the rule is worth).
THEIR_ROWS_MAX = 20_000


def their_sessions(index: MemoryIndex, focus: frozenset[str]) -> frozenset[int] | None:
    """The sessions (as the index hashes their names) of the memories holding the name of a
    speaker in ``focus`` (:func:`named_speakers`): the conversations the question's speakers
    take part in (or are talked about in). A store holding many conversations (an agent's,
    after months) ranks other conversations' turns among the candidates too; a question
    about Melanie is answered in the conversations Melanie is in
    (``ContextPolicy.other_conversation``). Found on the keyword side, no record read;
    ``None`` for the user's own messages (the user is in every conversation of their store)
    or a name more than ``THEIR_ROWS_MAX`` memories hold."""
    names = [s[:-2] for s in focus if s.lower() != USER_PREFIX]
    if not names:
        return None
    rows, _ = index.keyword.search(index, " ".join(names), THEIR_ROWS_MAX + 1, *NO_FILTERS)
    if not len(rows) or len(rows) > THEIR_ROWS_MAX:
        return None
    return frozenset(index.gather(rows, ("session",))["session"].tolist())  # np.unique imports numpy.ma


def without_names(engine: Engine, ranked: list[Ranked], query: str) -> str | None:
    """``query`` without the names (and their ``'s``) of the speakers it names among the
    best matches of ``ranked`` (:func:`named_speakers`); ``None`` when it names none, or
    nothing but the names would be left. Only a capitalised name is one: the user a
    question in the first person is about is not named by the word "user" ("How do I add
    user login?" asks about logins, not about the speaker)."""
    return without(query, names_in(named_speakers(engine, ranked[:SPEAKER_ROWS], query), query))


def without(query: str, names: list[str]) -> str | None:
    """``query`` without ``names`` (see :func:`without_names`)."""
    if not names:
        return None
    name = re.compile(r"\b(?:" + "|".join(map(re.escape, names)) + r")(?:['\u2019]s)?\b")
    rest = " ".join(name.sub(" ", query).split())
    return rest if WORD.search(rest) else None


def names_in(focus: frozenset[str] | None, query: str) -> list[str]:
    """The capitalised names of the speakers in ``focus`` (:func:`named_speakers`) that
    ``query`` holds as words, as :func:`without_names` takes them out."""
    words = set(WORD.findall(query))
    return sorted(s[:-2] for s in focus or () if s[:1].isupper() and s[:-2] in words)
