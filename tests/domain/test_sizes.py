"""The one parser of memory sizes (PostgreSQL's units), and the embedded server's shared_buffers,
which reads its setting through it."""
from __future__ import annotations

import pytest

from harvester.domain.sizes import format_size, parse_size
from harvester.store.embedded.server import EmbeddedServerError, shared_buffers

KB, MB, GB, TB = 1024, 1024 ** 2, 1024 ** 3, 1024 ** 4


@pytest.mark.parametrize("text, size", [
    ("64kB", 64 * KB), ("256MB", 256 * MB), ("2GB", 2 * GB), ("1TB", TB), ("2 GB", 2 * GB), (" 512MB\n", 512 * MB),
    ("0kB", 0),
])
def test_sizes_in_postgresql_units_are_bytes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "", "2", "2gb", "2G", "2KB", "1.5GB", "-1GB", "2 GB GB", "GB", "2PB", None])
def test_anything_else_is_refused_naming_the_text_and_the_units(text):
    with pytest.raises(ValueError) as caught:
        parse_size(text)
    assert str(caught.value) == (f"{text!r} is not a size: write a whole number and one of the units kB, MB, GB, TB"
                                 f" (case as shown), such as 512MB or 2GB")


@pytest.mark.parametrize("size, text", [(GB, "1GB"), (1536 * MB, "1536MB"), (3 * TB, "3TB"), (KB, "1kB"),
                                        (1025 * KB, "1025kB"), (0, "0kB")])
def test_sizes_are_written_in_the_largest_exact_unit(size, text):
    assert format_size(size) == text
    assert parse_size(text) == size


def test_a_size_that_is_not_whole_kilobytes_cannot_be_written():
    with pytest.raises(ValueError, match="1000 bytes is not a whole number of kB"):
        format_size(1000)


@pytest.mark.parametrize("value, given", [(None, "1GB"), ("256MB", "256MB"), ("2 GB", "2GB"), ("1TB", "1TB"),
                                          ("2048MB", "2GB")])
def test_the_embedded_server_takes_every_size_the_parser_takes(monkeypatch, value, given):
    if value is None:
        monkeypatch.delenv("HARVESTER_EMBEDDED_SHARED_BUFFERS", raising=False)
    else:
        monkeypatch.setenv("HARVESTER_EMBEDDED_SHARED_BUFFERS", value)
    assert shared_buffers() == given


def test_the_embedded_server_refuses_a_bad_size_naming_its_setting(monkeypatch):
    monkeypatch.setenv("HARVESTER_EMBEDDED_SHARED_BUFFERS", "2gb")
    with pytest.raises(EmbeddedServerError) as caught:
        shared_buffers()
    assert str(caught.value) == ("HARVESTER_EMBEDDED_SHARED_BUFFERS='2gb' must be a size such as 256MB or 2GB"
                                 " (units kB, MB, GB, TB)")


def test_an_hnsw_graph_is_its_vectors_and_720_bytes_each():
    from harvester.domain.sizes import hnsw_graph_bytes

    # pgvector's own notice, maintenance_work_mem = 16MB: "no longer fits ... after 7454 tuples" (768 halfvec)
    assert 7400 * hnsw_graph_bytes(1, 768) < 16 * MB < 7500 * hnsw_graph_bytes(1, 768)
    assert hnsw_graph_bytes(1_000_000, 768) == 1_000_000 * (2 * 768 + 720)
    assert hnsw_graph_bytes(10, 8, "vector") == 10 * (4 * 8 + 720)
    assert hnsw_graph_bytes(1_000_000, 768, "bit") == 1_000_000 * (96 + 720)  # a dimension a bit
    assert hnsw_graph_bytes(1, 9, "bit") == 2 + 720  # whole bytes
    assert hnsw_graph_bytes(0, 768) == 0


def test_a_build_gets_a_tenth_more_than_its_graph_between_the_floor_and_the_cap():
    from harvester.domain.sizes import build_memory

    assert build_memory(2000 * MB, GB, 4 * GB) == 2200 * MB
    assert build_memory(10 * MB, GB, 4 * GB) == GB          # the floor
    assert build_memory(10 * GB, GB, 4 * GB) == 4 * GB      # the cap
    assert build_memory(10 * MB, 2 * GB, GB) == 2 * GB      # a cap below the floor: the floor
    assert build_memory(MB + 1, 0, GB) == 2 * MB            # whole MB, rounded up
