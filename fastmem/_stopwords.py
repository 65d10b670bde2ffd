"""The one list of English function words fastmem leaves out, and where each part applies.

- :data:`STOP_WORDS`: words that carry no topic. The extractive summarizer leaves them out
  when it scores sentences (``fastmem.summarize``).
- :data:`QUERY_STOP_WORDS`: those plus the question words a query starts with ("how",
  "where", "could"...). The hybrid ranking drops them from a query before its BM25 half
  (``fastmem.recall.ranking.content_words``): they match everywhere and push the content words'
  matches down.

BM25 itself (``fastmem.storage.keyword_index``, and ``search(mode="keyword")``) uses no list: its idf
already makes words that occur everywhere count for little.
"""

from __future__ import annotations

STOP_WORDS = frozenset(
    "a an and are as at be but by do for from had has have he her his i if in into is it its "
    "me my no not of on or our she so than that the their them then there they this to was we "
    "were what when which who will with you your".split()
)

QUERY_STOP_WORDS = STOP_WORDS | frozenset(
    "can could did does him how should these those where whom why would".split()
)
