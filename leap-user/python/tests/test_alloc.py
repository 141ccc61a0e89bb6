"""After warm-up, moving frames through the binding allocates no memory of a
frame's size per frame: an LD_PRELOAD shim, compiled here, counts every
malloc, calloc, realloc and aligned allocation of at least half a frame
(Rust's allocator, numpy's and Python's all end there; tracemalloc would
see Python's alone), and a child process moves frames over every path of
the binding between two reads of that count.

Counted are the allocations of the thread that calls the binding: every
call of the binding, and the library under it, runs there. The UDP
transport's driver thread (loss recovery, the library's own) is not: it
sometimes grows a reassembly side slot for a chunk that arrived between two
receives (`Reassembler::place`, a few times in 5000 frames here), which is
the library's to bound, not the binding's."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import IN_CI

SHIM = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static atomic_ulong big;
static size_t threshold = (size_t)-1;
static __thread int counted_thread;

/* Counting starts when the test sets a threshold, on the calling thread. */
void leap_count_from(size_t bytes) { counted_thread = 1; threshold = bytes; }
unsigned long leap_big_allocations(void) { return atomic_load(&big); }

static void count(size_t n) { if (counted_thread && n >= threshold) atomic_fetch_add(&big, 1); }

void *malloc(size_t n) { count(n); return __libc_malloc(n); }
void *calloc(size_t k, size_t n) { count(k * n); return __libc_calloc(k, n); }
void *realloc(void *p, size_t n) { count(n); return __libc_realloc(p, n); }
void *memalign(size_t a, size_t n) { count(n); return __libc_memalign(a, n); }
void *aligned_alloc(size_t a, size_t n) { count(n); return __libc_memalign(a, n); }
int posix_memalign(void **out, size_t a, size_t n) {
    count(n);
    void *p = __libc_memalign(a, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
"""

CHILD = textwrap.dedent(
    """
    import ctypes, sys, numpy as np, leap
    sys.path.insert(0, sys.argv[1])
    from conftest import pair

    LEN = leap.frame_len(4096)
    shim = ctypes.CDLL(None)
    shim.leap_big_allocations.restype = ctypes.c_ulong
    kind = sys.argv[2]
    a, b = pair(kind, frame_size=LEN)
    src = np.full(LEN // 4, 2.0, np.float32)
    dst = np.empty(LEN, np.uint8)
    header, payload = src[:2], src[2:]

    def fill(out):
        np.frombuffer(out, np.float32)[:] = 1.0

    def rounds(n):
        for _ in range(n):
            a.send_next_with(LEN, fill)                    # in place
            with b.recv_prev() as f:                      # lent
                x = np.frombuffer(f, np.float32, offset=8)
                assert x[0] == 1.0
                del x
            b.send_next(src)                              # any buffer
            assert a.recv_prev_into(dst)[0] == LEN        # into the caller's
            a.send_multipart_next(header, payload)        # two buffers
            with b.recv_prev() as f:
                pass
            with a.send_next_with(LEN) as out:            # in place, with form
                np.frombuffer(out, np.float32)[:] = 3.0
            with b.recv_prev() as f:
                pass
            a.send_next_with(LEN, fill)
            assert b.relay() is None                      # passed on
            with a.recv_prev() as f:
                pass

    rounds(100)                                           # warm-up
    shim.leap_count_from(LEN // 2)
    before = shim.leap_big_allocations()
    rounds(1000)
    after = shim.leap_big_allocations()
    bytes(dst)                                            # one frame-sized copy: seen
    seen = shim.leap_big_allocations() - after
    print(after - before, seen)
    a.close(); b.close()
    """
)


@pytest.mark.parametrize("kind", ["tcp", "udp"])
def test_no_frame_sized_allocation_per_frame_after_warm_up(kind, tmp_path):
    gcc = shutil.which("gcc")
    if gcc is None:
        if IN_CI:
            pytest.fail("gcc is missing (the deps stage installs it)")
        pytest.skip("gcc is missing")
    shim = tmp_path / "count_alloc.so"
    src = tmp_path / "count_alloc.c"
    src.write_text(SHIM)
    subprocess.run([gcc, "-O2", "-shared", "-fPIC", "-o", str(shim), str(src)], check=True, timeout=60)
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    tests = str(Path(__file__).resolve().parent)
    r = subprocess.run([sys.executable, str(child), tests, kind], env={"LD_PRELOAD": str(shim), "PATH": "/usr/bin"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    per_frame, seen = map(int, r.stdout.split())
    assert seen >= 1, "the shim did not see a frame-sized allocation made on purpose"
    assert per_frame == 0, f"{per_frame} allocations of half a frame or more in 1000 rounds (8 frames each)"
