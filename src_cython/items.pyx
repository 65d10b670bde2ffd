# cython: language_level=3
"""Compiled item preparation for ``add_many``: a batch's checks, payloads and index-row
columns in one pass, and its given vectors gathered into one array.

Twins of fastmem._kernels.reference.prepare_batch, gather_vectors and memory_ids; see there for
contracts.
``prepare_batch`` takes the common item shapes itself (a dict of ASCII strings, floats and
booleans) and hands every other item to ``fallback`` (fastmem.storage.records.prepare), which
checks it and raises the error: an item the fast path would refuse is always handed over,
so both backends raise the same errors for the same items.
"""
import numpy as np

cimport numpy as cnp
from cpython.dict cimport PyDict_GetItem, PyDict_Size
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_GET_LENGTH, PyUnicode_READ_CHAR
from libc.math cimport isfinite
from libc.string cimport memcpy
from _types cimport u16, u32, f32, f64

cnp.import_array()

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object o)

# Kept equal to fastmem._format and fastmem.storage.records by tests/test_items.py (CONSTANTS below).
cdef enum:
    MAX_TEXT_BYTES = 1 << 20
    MAX_TYPE_CHARS = 64
    MAX_SESSION_CHARS = 256
    FLAG_PINNED = 2
    MAX_DIM = 4096
cdef double MAX_TIMESTAMP = 1e11
cdef dict DEFAULT_IMPORTANCE = {"fact": 0.9, "plan": 0.7, "tool_result": 0.5, "conversation": 0.3}
cdef double DEFAULT_USER_TYPE_IMPORTANCE = 0.5
# The keys an item may have (fastmem.storage.records.ADD_KEYS).
cdef tuple KEYS = ("text", "type", "timestamp", "session", "importance", "pinned", "metadata",
                   "summary", "embedding")

CONSTANTS = dict(MAX_TEXT_BYTES=MAX_TEXT_BYTES, MAX_TYPE_CHARS=MAX_TYPE_CHARS,
                 MAX_SESSION_CHARS=MAX_SESSION_CHARS, FLAG_PINNED=FLAG_PINNED, MAX_DIM=MAX_DIM,
                 MAX_TIMESTAMP=MAX_TIMESTAMP, DEFAULT_IMPORTANCE=dict(DEFAULT_IMPORTANCE),
                 DEFAULT_USER_TYPE_IMPORTANCE=DEFAULT_USER_TYPE_IMPORTANCE, ADD_KEYS=frozenset(KEYS))


cdef inline object _get(dict item, str key, int* found):
    """``item[key]``, counting it in ``found``; None when absent."""
    cdef PyObject* value = PyDict_GetItem(item, key)
    if value == NULL:
        return None
    found[0] += 1
    return <object>value


cdef inline bint _short_ascii(object value, Py_ssize_t max_chars):
    """An exact str of 1 to ``max_chars`` ASCII characters (valid, whatever it holds)."""
    if type(value) is not str or not PyUnicode_IS_ASCII(value):
        return False
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(value)
    return 0 < n <= max_chars


cdef inline bint _plain_text(object text):
    """An exact, ASCII, non-blank str of at most MAX_TEXT_BYTES characters."""
    if type(text) is not str or not PyUnicode_IS_ASCII(text):
        return False
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text)
    if n == 0 or n > MAX_TEXT_BYTES:
        return False
    # Any character above ' ' is not whitespace: most texts are decided by their first.
    return PyUnicode_READ_CHAR(text, 0) > 32 or not text.isspace()


cdef inline bint _unit_float(object value, double lo, double hi):
    if type(value) is not float:
        return False
    cdef double x = <double>value
    return isfinite(x) and lo <= x <= hi


def prepare_batch(list items, double now, object fallback):
    """The checked items' payloads and row columns; see fastmem._kernels.reference.prepare_batch."""
    cdef Py_ssize_t n = len(items), i
    cdef int found
    cdef list payloads = [], texts = [], embeddings = [], type_names = [], sessions = []
    cdef dict type_ids = {}, session_ids = {}, payload
    cdef object item, text, ts, type_name, session, importance, pinned, embedding, prepared
    cdef object t_now = now
    cdef object code
    cdef double default
    cdef cnp.ndarray type_index_a = np.empty(n, dtype=np.uint32)
    cdef cnp.ndarray session_index_a = np.empty(n, dtype=np.uint32)
    cdef cnp.ndarray importance_a = np.empty(n, dtype=np.float64)
    cdef cnp.ndarray flags_a = np.empty(n, dtype=np.uint16)
    cdef cnp.ndarray timestamps_a = np.empty(n, dtype=np.float64)
    cdef u32[::1] type_index = type_index_a, session_index = session_index_a
    cdef f64[::1] importance_col = importance_a, timestamps = timestamps_a
    cdef u16[::1] flags = flags_a
    for i in range(n):
        item = items[i]
        prepared = None
        if type(item) is not dict:
            prepared = fallback(i, item, now)
        else:
            found = 0
            text = _get(item, "text", &found)
            ts = _get(item, "timestamp", &found)
            type_name = _get(item, "type", &found)
            session = _get(item, "session", &found)
            importance = _get(item, "importance", &found)
            pinned = _get(item, "pinned", &found)
            if pinned is None and PyDict_GetItem(item, "pinned") == NULL:
                pinned = False
            embedding = _get(item, "embedding", &found)
            # Metadata and summaries take the general path; so do unknown keys (some key
            # not found above) and every value the checks below do not accept outright.
            if (_get(item, "metadata", &found) is not None
                    or _get(item, "summary", &found) is not None
                    or found != PyDict_Size(item)
                    or not _plain_text(text)
                    or (ts is not None and not _unit_float(ts, 0.0, MAX_TIMESTAMP))
                    or (type_name is not None and not _short_ascii(type_name, MAX_TYPE_CHARS))
                    or (session is not None and not _short_ascii(session, MAX_SESSION_CHARS))
                    or (importance is not None and not _unit_float(importance, 0.0, 1.0))
                    or (pinned is not True and pinned is not False)):
                prepared = fallback(i, item, now)
        if prepared is not None:
            payload = prepared.payload
            payloads.append(payload)
            texts.append(payload["x"])
            embeddings.append(prepared.embedding)
            type_name, session = prepared.type_name, prepared.session
            importance_col[i] = prepared.importance
            flags[i] = prepared.flags
            timestamps[i] = payload["t"]
        else:
            payload = {"i": 0, "t": t_now if ts is None else ts, "x": text}
            timestamps[i] = now if ts is None else <double>ts
            if type_name is None or type_name == "conversation":
                type_name = "conversation"
            else:
                payload["y"] = type_name
            if session is not None:
                payload["s"] = session
            default = <double>DEFAULT_IMPORTANCE.get(type_name, DEFAULT_USER_TYPE_IMPORTANCE)
            if importance is None:
                importance_col[i] = default
            else:
                importance_col[i] = <double>importance
                if <double>importance != default:
                    payload["p"] = importance
            if pinned is True:
                payload["n"] = True
                flags[i] = FLAG_PINNED
            else:
                flags[i] = 0
            payloads.append(payload)
            texts.append(text)
            embeddings.append(embedding)
        code = type_ids.get(type_name)
        if code is None:
            code = len(type_names)
            type_ids[type_name] = code
            type_names.append(type_name)
        type_index[i] = <u32>code
        if session is None:
            session_index[i] = 0
        else:
            code = session_ids.get(session)
            if code is None:
                sessions.append(session)
                code = len(sessions)
                session_ids[session] = code
            session_index[i] = <u32>code
    return (payloads, texts, embeddings, type_names, type_index_a, sessions, session_index_a,
            importance_a, flags_a, timestamps_a)


cdef inline object _base(cnp.ndarray a):
    cdef PyObject* base = cnp.PyArray_BASE(a)
    return None if base == NULL else <object>base


def gather_vectors(list vectors, Py_ssize_t dim):
    """The vectors as one float32 (n, length) array, or None; see
    fastmem._kernels.reference.gather_vectors. Rows that lie one after the other in one buffer
    (the rows of one 2-D array, as a model's batch gives them) are returned as a read-only
    view of that buffer, not copied."""
    cdef Py_ssize_t n = len(vectors), i, d = dim
    cdef cnp.ndarray a
    cdef char* first
    cdef object base
    cdef bint consecutive = True
    if n == 0:
        return None
    for i in range(n):
        v = vectors[i]
        if type(v) is not np.ndarray:
            return None
        a = <cnp.ndarray>v
        if (cnp.PyArray_NDIM(a) != 1 or cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32
                or not cnp.PyArray_ISNOTSWAPPED(a) or not cnp.PyArray_IS_C_CONTIGUOUS(a)):
            return None
        if d == 0:
            d = cnp.PyArray_DIMS(a)[0]
        if cnp.PyArray_DIMS(a)[0] != d or d > MAX_DIM or d == 0:
            return None
        if i == 0:
            first, base = <char*>cnp.PyArray_DATA(a), _base(a)
        elif consecutive:
            # Views of one buffer (the same base object; numpy makes every view's base the
            # object that owns the memory), each row right after the one before: the whole
            # span lies in that buffer.
            consecutive = (base is not None and _base(a) is base
                           and <char*>cnp.PyArray_DATA(a) == first + i * d * <Py_ssize_t>sizeof(f32))
    if consecutive and n > 1:
        return np.lib.stride_tricks.as_strided(vectors[0], shape=(n, d), strides=(d * sizeof(f32), sizeof(f32)),
                                               writeable=False)
    cdef cnp.ndarray out = np.empty((n, d), dtype=np.float32)
    cdef char* dst = <char*>cnp.PyArray_DATA(out)
    cdef Py_ssize_t row_bytes = d * sizeof(f32)
    for i in range(n):
        a = <cnp.ndarray>vectors[i]
        memcpy(dst + i * row_bytes, cnp.PyArray_DATA(a), row_bytes)
    return out


def memory_ids(unsigned long long first, Py_ssize_t n):
    """The ids of n memories numbered from first; see fastmem._kernels.reference.memory_ids. Each
    is written as ASCII straight into a new str (an f-string per id cost add_many ~0.1 us
    per memory)."""
    cdef list out = [None] * n
    cdef Py_ssize_t i, k, width
    cdef unsigned long long number
    cdef char digits[24]
    cdef char* data
    for i in range(n):
        number = first + <unsigned long long>i
        width = 0
        while True:
            digits[width] = <char>(48 + number % 10)
            number //= 10
            width += 1
            if number == 0:
                break
        text = PyUnicode_New(width + 1, 127)
        data = <char*>PyUnicode_DATA(text)
        data[0] = 109  # "m"
        for k in range(width):
            data[1 + k] = digits[width - 1 - k]
        out[i] = text
    return out
