"""memory.release(): what a step freed goes back to the system (glibc's malloc_trim), so that the next
task of the same process does not start from the previous one's peak."""
from harvester import memory


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
