# cython: language_level=3
"""A Python callable run in a new OS thread after a delay, the thread holding no GIL until then.

Twin of fastmem._threads._start_later_py. Opening a store starts its loaders (the model, the
encoding, the level-2 preload) a few milliseconds later so that they do not compete with
the restart (see fastmem/_threads.py). A Python thread, even one that only sleeps, must take
the GIL to begin: it takes it at the first system call of the caller's restart (each one
releases the GIL): a fresh process's open + 20 newest at 100 k took 0.774 ms with such a
thread, 0.734 ms with this one, which sleeps in C and takes the GIL only when the delay is
out (0.668 ms with no thread at all: the first thread of a process costs ~70 us to make).

At exit: a thread that has not taken the GIL when the interpreter starts to finalize must
not take it (the interpreter's state may be gone). ``_refuse_new`` (an atexit hook, run
before finalizing) sets ``exiting``; a thread that wakes counts itself in ``entering``
before it looks at ``exiting`` (sequentially consistent atomics, so one of the two sees the
other), and the hook waits, the GIL let go, for those counted to have taken it. Those run on
as Python threads do at exit (stopped when they next wait for the GIL).
"""
import atexit

from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF
from libc.stdlib cimport free, malloc

cdef extern from *:
    """
    #include <time.h>
    static int fastmem_exiting = 0;
    static int fastmem_entering = 0;
    static int fastmem_load(int* p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static void fastmem_store(int* p, int v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    static void fastmem_add(int* p, int v) { __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
    static void fastmem_nap(double seconds) {
        struct timespec t;
        t.tv_sec = (time_t)seconds;
        t.tv_nsec = (long)((seconds - (double)t.tv_sec) * 1e9);
        while (nanosleep(&t, &t) != 0) {}  /* a signal: sleep the rest */
    }
    """
    int fastmem_exiting
    int fastmem_entering
    int fastmem_load(int* p) noexcept nogil
    void fastmem_store(int* p, int v) noexcept nogil
    void fastmem_add(int* p, int v) noexcept nogil
    void fastmem_nap(double seconds) noexcept nogil

cdef extern from "pythread.h":
    # Python's own thread start (pthread_create inside the interpreter): calling pthread_create
    # from here would tie the wheels to glibc 2.34, where it moved into libc.
    ctypedef void (*thread_body)(void*) noexcept nogil
    unsigned long PyThread_start_new_thread(thread_body body, void* arg) nogil


cdef struct _Job:
    double delay
    PyObject* target


cdef void _call(PyObject* target) noexcept with gil:
    # noexcept: an exception goes to sys.unraisablehook, as one in a _thread thread does.
    cdef object fn = <object>target
    Py_DECREF(fn)  # the reference start_later took; ``fn`` holds one of its own
    fn()


cdef void _body(void* arg) noexcept nogil:
    # No malloc or free before the nap: a thread's first one makes its malloc arena (a
    # 128 MiB reservation, mapped and trimmed), which holds the process's map lock while
    # the caller's restart takes its page faults.
    cdef _Job job = (<_Job*>arg)[0]
    fastmem_nap(job.delay)
    free(arg)
    fastmem_add(&fastmem_entering, 1)
    if fastmem_load(&fastmem_exiting):
        fastmem_add(&fastmem_entering, -1)
        return  # the target's reference is left: the process is ending
    _call_counted(job.target)


cdef void _call_counted(PyObject* target) noexcept with gil:
    fastmem_add(&fastmem_entering, -1)  # holding the GIL now: the exit hook may go on
    _call(target)


def start_later(double delay, target):
    """Run ``target()`` in a new daemon OS thread ``delay`` seconds from now; return at once.

    Raises:
        RuntimeError: the thread could not be made.
    """
    cdef _Job* job
    if not callable(target):
        raise TypeError("target must be callable")
    if not delay >= 0:
        raise ValueError("delay must be >= 0")
    job = <_Job*>malloc(sizeof(_Job))
    if job == NULL:
        raise MemoryError()
    Py_INCREF(target)
    job.delay, job.target = delay, <PyObject*>target
    if PyThread_start_new_thread(_body, job) == <unsigned long>-1:
        Py_DECREF(target)
        free(job)
        raise RuntimeError("can't start a new thread")


def after_fork_in_child():
    """In a child made by fork(): the parent's sleeping threads do not exist here."""
    fastmem_store(&fastmem_entering, 0)


def _refuse_new():
    fastmem_store(&fastmem_exiting, 1)
    with nogil:
        while fastmem_load(&fastmem_entering) > 0:
            fastmem_nap(0.0001)


atexit.register(_refuse_new)
