"""The pure parts of fetching record bytes a snapshot-loaded read model lacks: which reads
cover a run's scattered offsets, and the byte-bounded cache of what was fetched."""

from __future__ import annotations

from runstream.engine.readmodel.records import SWEEP_GAP, RecordCache, sweeps


def test_offsets_close_together_are_read_in_one_sweep_far_ones_apart() -> None:
    far = 11 + SWEEP_GAP  # one past the largest gap a sweep reads through
    got = sweeps({(1, 5), (0, 3), (0, 4), (0, 10), (0, far), (1, 7)})
    assert got == [(0, 3, 11), (0, far, far + 1), (1, 5, 8)]
    assert sweeps(()) == []


def test_the_cache_keeps_its_budget_but_never_drops_what_one_call_added() -> None:
    cache = RecordCache(budget=10)
    cache.put({(0, 1): b"aaaa", (0, 2): b"bbbb"})
    assert cache.get((0, 1)) == b"aaaa"  # now the most recently used
    cache.put({(0, 3): b"cccc"})
    assert cache.get((0, 2)) is None and cache.size == 8
    assert cache.get((0, 1)) == b"aaaa" and cache.get((0, 3)) == b"cccc"
    cache.put({(1, n): b"x" * 6 for n in range(3)})  # one call larger than the budget
    assert all(cache.get((1, n)) == b"x" * 6 for n in range(3))
    assert cache.get((0, 1)) is None and cache.size == 18
    cache.put({(1, 0): b"yy"})  # a replaced record counts its new size; then the LRU goes
    assert cache.get((1, 0)) == b"yy" and cache.get((1, 1)) is None and cache.size == 8
