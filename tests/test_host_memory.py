"""Host memory: /proc sizes and freed heap pages handed back to the OS (glibc)."""

from __future__ import annotations

import pytest

from specrag_jax.host_memory import release_free_heap, status_mib


def test_status_reads_sizes_and_names_none_for_missing(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmRSS:\t  204800 kB\nRssAnon:\t1536 kB\n")
    assert status_mib("VmRSS", str(status)) == 200.0
    assert status_mib("RssAnon", str(status)) == 1.5
    assert status_mib("VmHWM", str(status)) is None
    assert status_mib("VmRSS", str(tmp_path / "absent")) is None


def test_freed_heap_stays_resident_until_released():
    if release_free_heap() is None or status_mib("RssAnon") is None:
        pytest.skip("not glibc on Linux")
    base = status_mib("RssAnon")
    chunks = [bytearray(60_000) for _ in range(6_000)]  # ~360 MB of heap chunks (below malloc's mmap threshold)
    del chunks[:-1]  # all freed but the last, which keeps the heap's top in place: nothing trims by itself
    held = status_mib("RssAnon")
    assert held - base > 250  # the negative control: freeing alone gives nothing back
    released = release_free_heap()
    assert released > 250 and status_mib("RssAnon") < held - 250
    del chunks
