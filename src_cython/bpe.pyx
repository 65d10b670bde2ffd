"""Exact cl100k_base token counts for ASCII text, without tiktoken's per-call cost.

The twin of ``fastmem._kernels_py.Cl100kCounter`` (tiktoken itself): the same count as
``len(encoding.encode_ordinary(text))`` for every text. An ASCII text is split by a
hand-written matcher of cl100k_base's pattern (below) and each piece is looked up whole in a
C hash table of the encoding's mergeable ranks, else merged pair by pair as tiktoken's
``byte_pair_merge`` does (lowest rank first, leftmost on ties); any other text goes to
tiktoken. The counting loop of ``count_many`` runs without the GIL.
"""

cimport cython
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc
from cpython.pythread cimport (
    PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock, PyThread_acquire_lock,
    PyThread_release_lock, WAIT_LOCK,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int8_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memmove, memset

cdef extern from "Python.h":
    void* PyMem_RawMalloc(size_t n) nogil
    void* PyMem_RawCalloc(size_t n, size_t size) nogil
    void PyMem_RawFree(void* p) nogil
    bint PyUnicode_IS_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)

# The pattern this matcher implements, alternative by alternative (next_piece). A counter is
# refused for an encoding with any other pattern.
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
    r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)

cdef extern from *:
    """
    #define FM_RANK_MAX 0xFFFFFFFFu
    """
    const uint32_t RANK_MAX "FM_RANK_MAX"  # no token: tiktoken's Rank::MAX

cdef enum:
    SMALL_PIECE = 100  # bytes: tiktoken's own threshold between its two merge loops

# ASCII character classes: \p{L} and \p{N} are only [A-Za-z] and [0-9] in ASCII; \s is
# Unicode White_Space, which in ASCII is \t \n \x0b \x0c \r and space (not \x1c-\x1f, which
# Python's str.isspace counts). Everything else is "other".
cdef enum:
    OTHER = 0
    LETTER = 1
    DIGIT = 2
    SPACE = 3   # white space other than \r and \n
    NEWLINE = 4  # \r or \n (also white space)

cdef uint8_t CLS[128]
cdef int _c
for _c in range(128):
    CLS[_c] = OTHER
for _c in range(ord("a"), ord("z") + 1):
    CLS[_c] = LETTER
for _c in range(ord("A"), ord("Z") + 1):
    CLS[_c] = LETTER
for _c in range(ord("0"), ord("9") + 1):
    CLS[_c] = DIGIT
for _c in (9, 11, 12, 32):
    CLS[_c] = SPACE
CLS[10] = NEWLINE
CLS[13] = NEWLINE


cdef inline bint is_space(uint8_t c) noexcept nogil:
    return CLS[c] >= SPACE


cdef inline uint8_t lower(uint8_t c) noexcept nogil:
    return c | 0x20 if CLS[c] == LETTER else c


cdef Py_ssize_t next_piece(const uint8_t* s, Py_ssize_t p, Py_ssize_t n) noexcept nogil:
    """The end of the piece that starts at ``p``: the first alternative of the pattern that
    matches there, as a backtracking matcher takes it (every position matches one)."""
    cdef uint8_t c = s[p], d, e
    cdef uint8_t k = CLS[c]
    cdef Py_ssize_t q, end
    # '(?i:[sdmt]|ll|ve|re)
    if c == 39 and p + 1 < n:
        d = lower(s[p + 1])
        if d == 115 or d == 100 or d == 109 or d == 116:  # s d m t
            return p + 2
        if p + 2 < n:
            e = lower(s[p + 2])
            if (d == 108 and e == 108) or (d == 118 and e == 101) or (d == 114 and e == 101):
                return p + 3  # ll ve re
    # [^\r\n\p{L}\p{N}]?+\p{L}++ : possessive, so a taken first character is never given back
    q = p + 1 if (k == OTHER or k == SPACE) else p
    if q < n and CLS[s[q]] == LETTER:
        q += 1
        while q < n and CLS[s[q]] == LETTER:
            q += 1
        return q
    # \p{N}{1,3}+
    if k == DIGIT:
        q = p + 1
        while q < n and q < p + 3 and CLS[s[q]] == DIGIT:
            q += 1
        return q
    # ' ?[^\s\p{L}\p{N}]++[\r\n]*+' : without the space, a space at p is not "other": fails
    q = p + 1 if c == 32 else p
    if q < n and CLS[s[q]] == OTHER:
        q += 1
        while q < n and CLS[s[q]] == OTHER:
            q += 1
        while q < n and CLS[s[q]] == NEWLINE:
            q += 1
        return q
    # Only white space is left at p.
    end = p + 1
    while end < n and is_space(s[end]):
        end += 1
    if end == n:  # \s++$
        return n
    q = end - 1  # \s*[\r\n]: the run up to its last \r or \n
    while q >= p:
        if CLS[s[q]] == NEWLINE:
            return q + 1
        q -= 1
    if end - 1 > p:  # \s+(?!\S): the run but its last, which stays before the non-space
        return end - 1
    return p + 1  # \s


# ---- the ranks: open addressing, the first 8 bytes of each key in its slot ----------------

cdef struct Entry:
    uint64_t head  # the key's first 8 bytes, zero-padded: most keys are whole here
    uint32_t rank
    uint32_t where  # offset of the key's bytes past the head << 8 | its length (0: empty)


cdef struct Table:
    Entry* slots
    uint64_t mask
    uint8_t* tails  # the bytes of keys longer than 8 after their head, one after another
    uint32_t* pairs  # the rank of every two-byte key (RANK_MAX: none), by b0 << 8 | b1


cdef inline uint64_t load_head(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    cdef uint64_t w = 0
    memcpy(&w, p, n if n < 8 else 8)
    return w


cdef inline uint64_t hash_bytes(uint64_t head, const uint8_t* p, Py_ssize_t n) noexcept nogil:
    # FxHash over 8-byte words (as tiktoken's FxHashMap), then a murmur finaliser so the low
    # bits that pick the slot depend on every byte.
    cdef uint64_t h = (<uint64_t>n ^ head) * <uint64_t>0x517CC1B727220A95
    cdef uint64_t w
    cdef Py_ssize_t i = 8
    while i + 8 <= n:
        memcpy(&w, p + i, 8)
        h = (((h << 5) | (h >> 59)) ^ w) * <uint64_t>0x517CC1B727220A95
        i += 8
    if i < n:
        w = 0
        memcpy(&w, p + i, n - i)
        h = (((h << 5) | (h >> 59)) ^ w) * <uint64_t>0x517CC1B727220A95
    h ^= h >> 33
    h *= <uint64_t>0xFF51AFD7ED558CCD
    h ^= h >> 33
    return h


cdef inline uint32_t rank_of(const Table* t, const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """The rank of the bytes ``p[:n]`` (1 <= n), or RANK_MAX when they are no token."""
    if n > 255:
        return RANK_MAX  # longer than any key (cl100k_base's longest is 128 bytes)
    cdef uint64_t head = load_head(p, n)
    return find(t, p, n, head, hash_bytes(head, p, n))


cdef inline uint32_t find(const Table* t, const uint8_t* p, Py_ssize_t n, uint64_t head,
                          uint64_t h) noexcept nogil:
    cdef uint64_t i = h & t.mask
    cdef const Entry* e
    while True:
        e = &t.slots[i]
        if e.where == 0:
            return RANK_MAX
        if e.head == head and (e.where & 0xFF) == <uint32_t>n and (
            n <= 8 or memcmp(t.tails + (e.where >> 8), p + 8, n - 8) == 0
        ):
            return e.rank
        i = (i + 1) & t.mask


# ---- tiktoken's byte_pair_merge, counting the parts it leaves -----------------------------

cdef inline uint32_t part_rank(const Table* t, const uint8_t* piece, const Py_ssize_t* starts,
                               Py_ssize_t i, Py_ssize_t parts) noexcept nogil:
    # The rank of parts i and i + 1 merged; parts[i + 1] is still there, hence i + 3.
    if i + 3 < parts:
        return rank_of(t, piece + starts[i], starts[i + 3] - starts[i])
    return RANK_MAX


cdef Py_ssize_t merge_small(const Table* t, const uint8_t* piece, Py_ssize_t n) noexcept nogil:
    """tiktoken's ``_byte_pair_merge`` (pieces under 100 bytes): the number of tokens."""
    cdef Py_ssize_t starts[SMALL_PIECE + 1]
    return merge_small_parts(t, piece, n, starts)


cdef inline Py_ssize_t merge_small_parts(const Table* t, const uint8_t* piece, Py_ssize_t n,
                                         Py_ssize_t* starts) noexcept nogil:
    """``merge_small``, leaving each token's start in ``starts`` (room for ``n + 1``; the
    entry after the last token's is ``n``)."""
    cdef uint32_t ranks[SMALL_PIECE + 1]
    cdef uint32_t min_rank = RANK_MAX, r
    cdef Py_ssize_t min_i = 0, i, parts = n + 1
    for i in range(n - 1):
        r = t.pairs[<uint32_t>piece[i] << 8 | piece[i + 1]]
        if r < min_rank:
            min_rank = r
            min_i = i
        starts[i] = i
        ranks[i] = r
    starts[n - 1] = n - 1
    ranks[n - 1] = RANK_MAX
    starts[n] = n
    ranks[n] = RANK_MAX
    while min_rank != RANK_MAX:
        i = min_i
        if i > 0:
            ranks[i - 1] = part_rank(t, piece, starts, i - 1, parts)
        ranks[i] = part_rank(t, piece, starts, i, parts)
        memmove(&starts[i + 1], &starts[i + 2], (parts - i - 2) * sizeof(Py_ssize_t))
        memmove(&ranks[i + 1], &ranks[i + 2], (parts - i - 2) * sizeof(uint32_t))
        parts -= 1
        min_rank = RANK_MAX
        for i in range(parts - 1):
            if ranks[i] < min_rank:  # strictly: the leftmost of equal ranks
                min_rank = ranks[i]
                min_i = i
    return parts - 1


cdef struct State:
    Py_ssize_t prev
    Py_ssize_t end
    Py_ssize_t next_end
    uint32_t next_rank


cdef inline void heap_push(uint64_t* heap, Py_ssize_t* size, uint64_t key) noexcept nogil:
    cdef Py_ssize_t i = size[0], parent
    size[0] += 1
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= key:
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = key


cdef inline uint64_t heap_pop(uint64_t* heap, Py_ssize_t* size) noexcept nogil:
    cdef uint64_t top = heap[0], last
    cdef Py_ssize_t i = 0, child, n
    size[0] -= 1
    n = size[0]
    last = heap[n]
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= last:
            break
        heap[i] = heap[child]
        i = child
    heap[i] = last
    return top


cdef inline void potential_merge(const Table* t, const uint8_t* piece, Py_ssize_t n,
                                 State* state, uint64_t* heap, Py_ssize_t* size,
                                 Py_ssize_t start, Py_ssize_t next_end) noexcept nogil:
    cdef uint32_t r
    state[start].next_end = next_end
    state[start].next_rank = RANK_MAX  # the old merge is invalid from now on
    if next_end <= n:
        r = rank_of(t, piece + start, next_end - start)
        if r != RANK_MAX:
            heap_push(heap, size, (<uint64_t>r << 32) | <uint64_t>start)
            state[start].next_rank = r


cdef Py_ssize_t merge_large(const Table* t, const uint8_t* piece, Py_ssize_t n,
                            Py_ssize_t* ends=NULL) noexcept nogil:
    """tiktoken's ``_byte_pair_merge_large`` (a heap of candidate merges keyed by rank, then
    start: the same merges as ``merge_small`` in O(n log n)): the number of tokens, or -1
    when out of memory or when a start does not fit the heap's 32 bits. ``ends`` (room for
    ``n``), when given, gets each token's end."""
    cdef State* state = <State*>PyMem_RawMalloc(n * sizeof(State))
    # Pushes: n - 1 pairs, then at most two per merge (of which there are at most n - 1).
    cdef uint64_t* heap = <uint64_t*>PyMem_RawMalloc(3 * n * sizeof(uint64_t))
    cdef Py_ssize_t size = 0, i, left_start, right_start, right_end, count
    cdef uint32_t r
    cdef uint64_t top
    if state == NULL or heap == NULL or n >= RANK_MAX:
        PyMem_RawFree(state)
        PyMem_RawFree(heap)
        return -1
    for i in range(n):
        state[i].prev = i - 1 if i > 0 else -1
        state[i].end = i + 1
        state[i].next_end = i + 2
        state[i].next_rank = RANK_MAX
    for i in range(n - 1):
        r = t.pairs[<uint32_t>piece[i] << 8 | piece[i + 1]]
        if r != RANK_MAX:
            heap_push(heap, &size, (<uint64_t>r << 32) | <uint64_t>i)
            state[i].next_rank = r
    while size > 0:
        top = heap_pop(heap, &size)
        r = <uint32_t>(top >> 32)
        left_start = <Py_ssize_t>(top & RANK_MAX)
        if r != state[left_start].next_rank:
            continue  # invalidated since it was pushed
        right_start = state[left_start].end
        right_end = state[left_start].next_end
        state[left_start].end = right_end
        potential_merge(t, piece, n, state, heap, &size, left_start, state[right_start].next_end)
        if right_end < n:
            state[right_end].prev = left_start
        if left_start > 0:
            potential_merge(t, piece, n, state, heap, &size, state[left_start].prev, right_end)
        state[right_start].next_rank = RANK_MAX
    count = 0
    i = 0
    while i < n:
        i = state[i].end
        if ends != NULL:
            ends[count] = i
        count += 1
    PyMem_RawFree(state)
    PyMem_RawFree(heap)
    return count


# The counts of short pieces are remembered (a word comes back text after text, and most of
# a bulk load's words are no single token: merged pair by pair, they cost the most): a
# direct-mapped table, kept by the counter for its next calls (Cl100kCounter.take_memo) and
# used by one thread at a time. An entry is the count of the piece it names, whichever call
# made it.
cdef struct Memo:
    uint64_t head
    uint64_t rest  # bytes 8 to 16, zero-padded
    uint32_t length  # 0: empty
    uint32_t count

cdef enum:
    MEMO_SLOTS = 65536  # 1.5 MB (twice as many slots: ~15% faster again on the workload, at 3 MB)
    MEMO_BYTES = 16  # the longest piece remembered
    MEMO_MIN_TEXTS = 64  # a smaller batch does not repay taking a memo
    MEMO_POOL = 4  # memos a counter keeps: one per thread counting at the same time


cdef inline Py_ssize_t count_piece(const Table* t, Memo* memo, const uint8_t* p,
                                   Py_ssize_t n) noexcept nogil:
    """The number of tokens of the piece ``p[:n]``, or -1 as ``merge_large``."""
    cdef uint64_t head, rest, h
    cdef Memo* m
    cdef Py_ssize_t k
    if n == 1:
        return 1  # every single byte is a token
    if n >= SMALL_PIECE:
        return merge_large(t, p, n)  # not one token either: none is this long
    head = load_head(p, n)
    h = hash_bytes(head, p, n)
    if memo == NULL or n > MEMO_BYTES:
        if find(t, p, n, head, h) != RANK_MAX:
            return 1  # most pieces are one token
        return merge_small(t, p, n)
    # The memo first, for every piece: it stays in the L2 cache, where the ranks' table (4 MB)
    # does not, and a batch's words repeat.
    rest = load_head(p + 8, n - 8) if n > 8 else 0
    m = &memo[(h >> 40) & (MEMO_SLOTS - 1)]
    if m.length == n and m.head == head and m.rest == rest:
        return m.count
    k = 1 if find(t, p, n, head, h) != RANK_MAX else merge_small(t, p, n)
    m.head = head
    m.rest = rest
    m.length = <uint32_t>n
    m.count = <uint32_t>k
    return k


cdef Py_ssize_t count_ascii(const Table* t, Memo* memo, const uint8_t* s,
                            Py_ssize_t n) noexcept nogil:
    """The number of tokens of the ASCII text ``s[:n]``, or -1 when it must be left to
    tiktoken (out of memory, a piece over 4 GB)."""
    cdef Py_ssize_t p = 0, q, total = 0, k
    while p < n:
        q = next_piece(s, p, n)
        k = count_piece(t, memo, s + p, q - p)
        if k < 0:
            return -1
        total += k
        p = q
    return total


cdef struct Key:
    const uint8_t* p  # the token's bytes
    Py_ssize_t n
    uint32_t rank


cdef int8_t B64[256]  # the value of each base64 character (standard alphabet), -1: none
memset(B64, -1, 256)
for _c in range(64):
    B64[b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[_c]] = _c


cdef Py_ssize_t parse_ranks_file(const uint8_t* s, Py_ssize_t size, Key* keys,
                                 uint8_t* out) noexcept:
    """The keys of a ``.tiktoken`` file's lines, ``<base64 token> <decimal rank>`` (what
    tiktoken's ``load_tiktoken_bpe`` reads; empty lines skipped), decoded into ``out``:
    their count, or minus the number of the first line that is not such a line."""
    cdef Py_ssize_t at = 0, line = 0, n_keys = 0, end, space, i, n, pad
    cdef uint64_t rank
    cdef uint32_t v
    cdef int8_t c0, c1, c2, c3
    while at < size:
        line += 1
        end = at
        while end < size and s[end] != 10:
            end += 1
        if end == at:  # an empty line
            at = end + 1
            continue
        space = at
        while space < end and s[space] != 32:
            space += 1
        n = space - at
        if n == 0 or n % 4 or space + 1 >= end or end - space - 1 > 10:
            return -line
        rank = 0
        for i in range(space + 1, end):
            if not 48 <= s[i] <= 57:
                return -line
            rank = rank * 10 + (s[i] - 48)
        if rank >= RANK_MAX:
            return -line
        pad = (s[space - 1] == 61) + (s[space - 2] == 61)
        if pad == 1 and s[space - 2] == 61:
            return -line
        keys[n_keys].p = out
        keys[n_keys].n = n // 4 * 3 - pad
        keys[n_keys].rank = <uint32_t>rank
        for i in range(at, space, 4):
            c0, c1 = B64[s[i]], B64[s[i + 1]]
            c2 = 0 if i + 4 == space and pad == 2 else B64[s[i + 2]]
            c3 = 0 if i + 4 == space and pad >= 1 else B64[s[i + 3]]
            if c0 < 0 or c1 < 0 or c2 < 0 or c3 < 0:
                return -line
            v = <uint32_t>c0 << 18 | <uint32_t>c1 << 12 | <uint32_t>c2 << 6 | <uint32_t>c3
            out[0], out[1], out[2] = v >> 16, (v >> 8) & 0xFF, v & 0xFF
            out += 3
        out -= pad
        n_keys += 1
        at = end + 1
    return n_keys


cdef Py_ssize_t parse_into(bytes data, Key** keys, uint8_t** decoded) except -1:
    """``parse_ranks_file`` of ``data`` into buffers made here, which the caller frees (also
    when this raises): the number of keys.

    Raises:
        ValueError: a line that is not ``<base64 token> <decimal rank>``.
    """
    # Decoded base64 is 3/4 of its text, and a line is at least 6 bytes: the file's size
    # bounds both buffers.
    keys[0] = <Key*>PyMem_Malloc((len(data) // 5 + 1) * sizeof(Key))
    decoded[0] = <uint8_t*>PyMem_Malloc(len(data) + 1)
    if keys[0] == NULL or decoded[0] == NULL:
        raise MemoryError()
    cdef Py_ssize_t n_keys = parse_ranks_file(<const uint8_t*>PyBytes_AS_STRING(data), len(data),
                                              keys[0], decoded[0])
    if n_keys < 0:
        raise ValueError(f"not a tiktoken ranks file (line {-n_keys})")
    return n_keys


def ranks_file(bytes data not None) -> dict:
    """``{token: rank}`` of a ``.tiktoken`` ranks file, as tiktoken's ``load_tiktoken_bpe``
    returns it (~20 ms for cl100k_base's, where tiktoken's Python loop takes ~70 ms); the
    twin of fastmem._kernels_py.ranks_file.

    Raises:
        ValueError: a line that is not ``<base64 token> <decimal rank>``, or a token twice.
    """
    cdef Key* keys = NULL
    cdef uint8_t* decoded = NULL
    cdef Py_ssize_t n_keys, k
    cdef dict out = {}
    try:
        n_keys = parse_into(data, &keys, &decoded)
        for k in range(n_keys):
            out[PyBytes_FromStringAndSize(<const char*>keys[k].p, keys[k].n)] = keys[k].rank
        if len(out) != n_keys:
            raise ValueError("a token listed twice")
        return out
    finally:
        PyMem_Free(keys)
        PyMem_Free(decoded)


@cython.auto_pickle(False)  # a table of C pointers: rebuilt from the encoding, never pickled
cdef class Cl100kCounter:
    """Counts tokens exactly as ``len(encoding.encode_ordinary(text))`` for a tiktoken
    encoding with cl100k_base's pattern; builds its table of ranks when created (~tens of ms).

    Raises:
        ValueError: the encoding's pattern is not cl100k_base's, or its ranks do not fit.
    """

    cdef Table table
    cdef object _encode
    # Memos kept between calls, each free for any thread to take: taken and given back
    # under the GIL (no lock of their own that a fork() could leave held in a child).
    cdef Memo* memos[MEMO_POOL]
    cdef int n_memos

    def __cinit__(self, source, encode=None):
        """``source``: a tiktoken encoding with cl100k_base's pattern, or the bytes of a
        ``.tiktoken`` ranks file that the caller has checked is cl100k_base's (its sha256),
        with ``encode``, the function that encodes other text (tiktoken's
        ``encode_ordinary``, loaded when first called). From the file, no tiktoken load is
        waited for: ~10 ms, where loading the encoding takes ~0.1 s."""
        self.n_memos = 0
        self.table.slots = NULL
        self.table.tails = NULL
        self.table.pairs = NULL
        cdef Key* keys = NULL
        cdef uint8_t* decoded = NULL
        cdef Py_ssize_t n_keys = 0
        cdef bytes key
        try:
            if isinstance(source, bytes):
                if not callable(encode):
                    raise TypeError("a counter made from a ranks file needs encode()")
                self._encode = encode
                n_keys = parse_into(source, &keys, &decoded)
                self.build(keys, n_keys)
            else:
                if source._pat_str != CL100K_PATTERN:
                    raise ValueError("not cl100k_base's pattern: this counter would split it wrongly")
                self._encode = source.encode_ordinary
                ranks = source._mergeable_ranks  # held: the keys point into its bytes
                keys = <Key*>PyMem_Malloc((len(ranks) + 1) * sizeof(Key))
                if keys == NULL:
                    raise MemoryError()
                for key, rank in ranks.items():
                    if not 0 <= rank < RANK_MAX:
                        raise ValueError(f"a rank this counter cannot hold: {key!r} -> {rank!r}")
                    keys[n_keys].p = <const uint8_t*>PyBytes_AS_STRING(key)
                    keys[n_keys].n = len(key)
                    keys[n_keys].rank = <uint32_t>rank
                    n_keys += 1
                self.build(keys, n_keys)
        finally:
            PyMem_Free(keys)
            PyMem_Free(decoded)

    cdef int build(self, const Key* keys, Py_ssize_t n_keys) except -1:
        """The hash table of ``keys`` (and of every two-byte key, by its bytes)."""
        cdef Py_ssize_t tails = 0, slots = 1, n, k
        for k in range(n_keys):
            n = keys[k].n
            if n == 0 or n > 255:
                raise ValueError(f"a token this counter cannot hold: {bytes(keys[k].p[:n])!r}")
            tails += max(0, n - 8)
        if tails >= 1 << 24:
            raise ValueError("more token bytes than this counter can hold")
        while slots < 2 * n_keys:
            slots *= 2
        self.table.slots = <Entry*>PyMem_Malloc(slots * sizeof(Entry))
        self.table.tails = <uint8_t*>PyMem_Malloc(tails + 1)
        self.table.pairs = <uint32_t*>PyMem_Malloc(65536 * sizeof(uint32_t))
        if self.table.slots == NULL or self.table.tails == NULL or self.table.pairs == NULL:
            raise MemoryError()
        memset(self.table.slots, 0, slots * sizeof(Entry))
        self.table.mask = slots - 1
        cdef uint64_t head, i
        cdef Py_ssize_t offset = 0
        cdef const uint8_t* p
        for k in range(n_keys):
            p, n = keys[k].p, keys[k].n
            head = load_head(p, n)
            i = hash_bytes(head, p, n) & self.table.mask
            while self.table.slots[i].where != 0:
                if self.table.slots[i].head == head and (self.table.slots[i].where & 0xFF) == n and (
                        n <= 8 or memcmp(self.table.tails + (self.table.slots[i].where >> 8), p + 8, n - 8) == 0):
                    raise ValueError(f"a token listed twice: {bytes(p[:n])!r}")
                i = (i + 1) & self.table.mask
            self.table.slots[i].head = head
            self.table.slots[i].rank = keys[k].rank
            self.table.slots[i].where = <uint32_t>(offset << 8 | n)
            if n > 8:
                memcpy(self.table.tails + offset, p + 8, n - 8)
                offset += n - 8
        cdef uint8_t pair[2]
        cdef uint32_t b
        for b in range(65536):
            pair[0] = b >> 8
            pair[1] = b & 0xFF
            self.table.pairs[b] = rank_of(&self.table, pair, 2)
        return 0

    def __dealloc__(self):
        PyMem_Free(self.table.slots)
        PyMem_Free(self.table.tails)
        PyMem_Free(self.table.pairs)
        while self.n_memos:
            self.n_memos -= 1
            PyMem_RawFree(self.memos[self.n_memos])

    cdef Memo* take_memo(self) noexcept:
        """(With the GIL.) A memo for this thread alone until give_memo: one kept from an
        earlier call, else a new one (NULL: out of memory; counting goes on without one)."""
        if self.n_memos:
            self.n_memos -= 1
            return self.memos[self.n_memos]
        return <Memo*>PyMem_RawCalloc(MEMO_SLOTS, sizeof(Memo))

    cdef void give_memo(self, Memo* memo) noexcept:
        """(With the GIL.) Keep ``memo`` for the next call (beyond MEMO_POOL: freed)."""
        if memo == NULL:
            return
        if self.n_memos < MEMO_POOL:
            self.memos[self.n_memos] = memo
            self.n_memos += 1
        else:
            PyMem_RawFree(memo)

    def count(self, text) -> int:
        """The number of tokens of ``text`` (special tokens counted as plain text)."""
        cdef Py_ssize_t n
        if isinstance(text, str) and PyUnicode_IS_ASCII(text):
            n = count_ascii(&self.table, NULL, <const uint8_t*>PyUnicode_DATA(text),
                            PyUnicode_GET_LENGTH(text))
            if n >= 0:
                return n
        return len(self._encode(text))

    def shared(self, texts) -> SharedCount:
        """The counts of ``texts`` made by every thread that calls the result's ``work()``
        at the same time (see SharedCount)."""
        return SharedCount(self, texts)

    def token_ends(self, text, Py_ssize_t limit):
        """Where each of the first ``limit`` tokens of ``text`` ends (character offsets, in
        order; fewer when it has fewer), or None when the text is not ASCII: what
        truncating at a token needs, without tiktoken."""
        if not (isinstance(text, str) and PyUnicode_IS_ASCII(text)):
            return None
        cdef const uint8_t* s = <const uint8_t*>PyUnicode_DATA(text)
        cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text), p = 0, q, m, k, j
        cdef Py_ssize_t starts[SMALL_PIECE + 1]
        cdef Py_ssize_t* ends
        cdef uint64_t head
        cdef list out = []
        while p < n and len(out) < limit:
            q = next_piece(s, p, n)
            m = q - p
            head = load_head(s + p, m) if m < SMALL_PIECE else 0
            if m == 1 or (m < SMALL_PIECE and find(&self.table, s + p, m, head,
                                                   hash_bytes(head, s + p, m)) != RANK_MAX):
                out.append(q)
            elif m < SMALL_PIECE:
                k = merge_small_parts(&self.table, s + p, m, starts)
                for j in range(1, k + 1):
                    out.append(p + starts[j])
            else:
                ends = <Py_ssize_t*>PyMem_Malloc(m * sizeof(Py_ssize_t))
                if ends == NULL:
                    raise MemoryError()
                try:
                    k = merge_large(&self.table, s + p, m, ends)
                    if k < 0:
                        return None
                    for j in range(k):
                        out.append(p + ends[j])
                finally:
                    PyMem_Free(ends)
            p = q
        del out[limit:]
        return out

    def count_many(self, texts) -> list:
        """The token count of each text in ``texts``, the ASCII ones in one loop without the
        GIL, the others by tiktoken."""
        cdef tuple held = tuple(texts)  # keeps every text alive while the GIL is released
        cdef Py_ssize_t m = len(held), i
        cdef const uint8_t** data = <const uint8_t**>PyMem_Malloc((m + 1) * sizeof(void*))
        cdef Py_ssize_t* lengths = <Py_ssize_t*>PyMem_Malloc((m + 1) * sizeof(Py_ssize_t))
        cdef const Table* t = &self.table
        cdef Memo* memo = NULL
        if data == NULL or lengths == NULL:
            PyMem_Free(data)
            PyMem_Free(lengths)
            raise MemoryError()
        try:
            for i in range(m):
                text = held[i]
                if isinstance(text, str) and PyUnicode_IS_ASCII(text):
                    data[i] = <const uint8_t*>PyUnicode_DATA(text)
                    lengths[i] = PyUnicode_GET_LENGTH(text)
                else:
                    data[i] = NULL
                    lengths[i] = -1
            if m >= MEMO_MIN_TEXTS:
                memo = self.take_memo()
            with nogil:
                for i in range(m):
                    if data[i] != NULL:
                        lengths[i] = count_ascii(t, memo, data[i], lengths[i])
            self.give_memo(memo)
            encode = self._encode
            return [lengths[i] if lengths[i] >= 0 else len(encode(held[i])) for i in range(m)]
        finally:
            PyMem_Free(data)
            PyMem_Free(lengths)


cdef enum:
    SHARED_STEP = 64  # texts a thread takes at a time: one lock per ~0.1 ms of counting


@cython.auto_pickle(False)
cdef class SharedCount:
    """One batch's token counts, counted by every thread that calls :meth:`work` at once.

    The texts are cut into steps of SHARED_STEP; a thread takes the next free step under a
    lock, counts it without the GIL (with a memo of its own) into its own buffer, and
    copies the counts in under the lock unless another thread finished that step first.
    ``work(steal=True)`` also counts the steps other threads hold but have not finished:
    its caller never waits for a thread that the machine has descheduled (the counts are
    the same whoever makes them). When it returns, every count is in."""

    cdef Cl100kCounter counter
    cdef tuple held  # keeps every text alive while the GIL is released
    cdef const uint8_t** data
    cdef Py_ssize_t* lengths  # each text's length (NULL data: not ASCII)
    cdef Py_ssize_t* out  # each text's count (-1: tiktoken counts it), written under lock
    cdef uint8_t* state  # each step's: 0 free, 1 taken, 2 counted
    cdef Py_ssize_t m
    cdef Py_ssize_t steps
    cdef Py_ssize_t next_free
    cdef PyThread_type_lock lock

    def __cinit__(self, Cl100kCounter counter, texts):
        self.counter = counter
        self.held = tuple(texts)
        cdef Py_ssize_t m = len(self.held), i
        self.m = m
        self.steps = (m + SHARED_STEP - 1) // SHARED_STEP
        self.next_free = 0
        self.data = <const uint8_t**>PyMem_Malloc((m + 1) * sizeof(void*))
        self.lengths = <Py_ssize_t*>PyMem_Malloc((m + 1) * sizeof(Py_ssize_t))
        self.out = <Py_ssize_t*>PyMem_Malloc((m + 1) * sizeof(Py_ssize_t))
        self.state = <uint8_t*>PyMem_Calloc(self.steps + 1, 1)
        self.lock = PyThread_allocate_lock()
        if self.data == NULL or self.lengths == NULL or self.out == NULL or self.state == NULL \
                or self.lock == NULL:
            raise MemoryError()
        for i in range(m):
            text = self.held[i]
            if isinstance(text, str) and PyUnicode_IS_ASCII(text):
                self.data[i] = <const uint8_t*>PyUnicode_DATA(text)
                self.lengths[i] = PyUnicode_GET_LENGTH(text)
            else:
                self.data[i] = NULL
                self.lengths[i] = -1

    def __dealloc__(self):
        PyMem_Free(self.data)
        PyMem_Free(self.lengths)
        PyMem_Free(self.out)
        PyMem_Free(self.state)
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    def work(self, bint steal=False) -> int:
        """Count free steps until none is left (and, with ``steal``, the steps other
        threads hold but have not finished), without the GIL; returns how many steps of
        texts this call counted first."""
        cdef const Table* t = &self.counter.table
        cdef Memo* memo = NULL
        cdef Py_ssize_t* local = <Py_ssize_t*>PyMem_Malloc(SHARED_STEP * sizeof(Py_ssize_t))
        cdef Py_ssize_t s, i, a, b, mine = 0
        if local == NULL:
            raise MemoryError()
        if self.m >= MEMO_MIN_TEXTS:
            memo = self.counter.take_memo()
        try:
            with nogil:
                while True:
                    PyThread_acquire_lock(self.lock, WAIT_LOCK)
                    s = self._take(steal)
                    PyThread_release_lock(self.lock)
                    if s < 0:
                        break
                    a = s * SHARED_STEP
                    b = a + SHARED_STEP if a + SHARED_STEP < self.m else self.m
                    for i in range(a, b):
                        local[i - a] = -1 if self.data[i] == NULL else \
                            count_ascii(t, memo, self.data[i], self.lengths[i])
                    PyThread_acquire_lock(self.lock, WAIT_LOCK)
                    if self.state[s] != 2:  # not finished by a thread that took it over
                        memcpy(self.out + a, local, (b - a) * sizeof(Py_ssize_t))
                        self.state[s] = 2
                        mine += 1
                    PyThread_release_lock(self.lock)
        finally:
            self.counter.give_memo(memo)
            PyMem_Free(local)
        return mine

    cdef Py_ssize_t _take(self, bint steal) noexcept nogil:
        # Under the lock: the next free step (now taken), else with steal the first step
        # taken but not counted, else -1. A step goes only from free to taken to counted.
        cdef Py_ssize_t s
        while self.next_free < self.steps and self.state[self.next_free] != 0:
            self.next_free += 1
        if self.next_free < self.steps:
            s = self.next_free
            self.state[s] = 1
            self.next_free += 1
            return s
        if steal:
            for s in range(self.steps):
                if self.state[s] == 1:
                    return s
        return -1

    def counts(self) -> list:
        """The count of each text (those not ASCII by tiktoken): counts whatever is not
        counted yet itself (``work(steal=True)``), so it never waits for another thread."""
        self.work(True)
        encode = self.counter._encode
        held = self.held
        return [self.out[i] if self.out[i] >= 0 else len(encode(held[i])) for i in range(self.m)]
