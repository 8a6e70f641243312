"""memory.release(): what a step freed goes back to the system (glibc's malloc_trim), so that the next
task of the same process does not start from the previous one's peak."""
import os

from harvester.pipeline import memory


def test_release_hands_freed_pages_back():
    kept = []
    junk = [bytes(2000) for _ in range(100_000)]  # ~200 MB from the C allocator, not Python's arenas
    kept = junk[::100]                              # a few survivors scattered through the heap
    del junk
    before, after = memory.release()
    assert before - after > 100, (before, after)   # not left to the allocator for later
    assert memory.peak_rss_mb() > before - 8     # two ways of counting: a few MB apart
    assert len(kept) == 1000


def test_resident_size_is_read():
    assert 10 < memory.rss_mb() <= memory.peak_rss_mb() + 1


ARENAS = """
import ctypes, ctypes.util, os, re, sys, tempfile, threading
sys.path.insert(0, {plugins!r})
import os

from harvester.pipeline import memory
capped = memory.cap_arenas(2) if sys.argv[1] == "capped" else False
barrier = threading.Barrier(8)

def work():
    barrier.wait()  # all at once: each contends for an arena
    for _ in range(200):
        junk = [bytes(300) for _ in range(2000)]
        del junk

threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
path = tempfile.mktemp()
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(fp))
libc.fclose(ctypes.c_void_p(fp))
print(capped, len(re.findall(r'<heap nr="', open(path).read())))
os.unlink(path)
"""


def test_cap_arenas_keeps_threads_to_two_malloc_arenas():
    """Eight threads allocating at once: without the cap glibc gives them arenas of their own (up to
    eight per core), with it they share two (counted by glibc's malloc_info)."""
    import subprocess
    import sys
    from pathlib import Path

    script = ARENAS.format(plugins=str(Path(memory.__file__).parents[2]))
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}

    def arenas(mode):
        out = subprocess.run([sys.executable, "-c", script, mode], env=env, capture_output=True, text=True,
                             check=True).stdout.split()
        return out[0] == "True", int(out[1])

    assert arenas("capped") == (True, 2)
    capped_not, free = arenas("free")
    assert not capped_not and free > 2, free
    # a MALLOC_ARENA_MAX of the environment rules: cap_arenas leaves it alone
    env["MALLOC_ARENA_MAX"] = "4"
    assert arenas("capped")[0] is False
