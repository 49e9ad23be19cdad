"""engine/platform/hugepages.py: tensors gathered into one region keep their values, shapes and dtypes,
start on their alignment, and the region is counted once at its own size; a w8a variant's weights
live there and its products are unchanged; a region no tensor holds serves the next of about its size,
zeroed, and idle regions past the cap are unmapped."""

import torch

from engine.platform import hugepages


def test_gathered_tensors_keep_their_values_and_sit_side_by_side():
    ts = [torch.randint(-127, 128, (7, 96), dtype=torch.int8), torch.randn(5, 3).half(), torch.randn(13)]
    out = hugepages.gather(ts, align=64)
    assert all(torch.equal(a, b) and a.dtype == b.dtype and a.shape == b.shape for a, b in zip(ts, out))
    assert all(o.data_ptr() % 64 == 0 for o in out)
    storages = {o.untyped_storage().data_ptr() for o in out}
    assert len(storages) == 1  # one region
    assert out[0].untyped_storage().nbytes() == 64 * 11 + 64 + 64  # each rounded up to 64 bytes, no more
    out[1].zero_()  # a view of the region, not of the originals
    assert ts[1].abs().sum() > 0 and out[1].abs().sum() == 0


def test_the_region_starts_on_a_huge_page():
    r = hugepages.region(3 << 20)
    assert r.numel() == 3 << 20 and r.data_ptr() % hugepages.HUGE == 0 and int(r.sum()) == 0


def test_a_cpu_kv_cache_of_a_huge_page_or_more_lives_in_them_and_keeps_its_rows_as_it_grows():
    from engine.model.kv_cache import KVCache

    small = KVCache(2, 3, 64, 8, torch.float32, "cpu", "int8")  # 12 KB: torch's own block, no 2 MB rounding
    assert all(t.untyped_storage().resizable() for t in (small.k, small.v, small.k_scale, small.v_scale))
    cache = KVCache(30, 3, 64, 400, torch.float32, "cpu", "int8")  # k, v: 2.3 MB each; scales 144 KB
    assert not cache.k.untyped_storage().resizable() and cache.k.data_ptr() % hugepages.HUGE == 0  # a region
    assert cache.k.untyped_storage().nbytes() == cache.k.numel()  # counted at its own size
    assert cache.k_scale.untyped_storage().resizable()
    k = torch.randn(1, 3, 10, 64)
    cache.store(4, 0, k, -k)
    cache.length = 10
    before = cache.read(4, 10)
    cache.ensure_capacity(2000)
    assert cache.capacity >= 2000 and all(t.data_ptr() % hugepages.HUGE == 0 for t in (cache.k, cache.v))
    keys, values = cache.read(4, 10)
    assert torch.allclose(keys, k, rtol=0.01, atol=0.02) and torch.allclose(values, -k, rtol=0.01, atol=0.02)
    assert torch.equal(keys, before[0]) and torch.equal(values, before[1])  # growth copies the rows exactly


def test_a_region_no_tensor_holds_serves_the_next_of_about_its_size_zeroed(monkeypatch):
    monkeypatch.setattr(hugepages, "_regions", [])
    a = hugepages.region(5 << 20)
    first = a.data_ptr()
    a.fill_(7)
    view = a[10:20]
    del a
    held = hugepages.region(5 << 20)  # a view still holds the first: a new region
    assert held.data_ptr() != first and hugepages.idle_bytes() == 0
    del view
    assert hugepages.idle_bytes() == (5 << 20) + hugepages.HUGE
    again = hugepages.region(4 << 20)  # within REUSE_SLACK of the idle one's size: it, zeroed
    assert again.data_ptr() == first and int(again.sum()) == 0 and again.numel() == 4 << 20
    small = hugepages.region(1 << 20)  # far smaller: a region of its own, no idle room held by it
    assert small.data_ptr() not in (first, held.data_ptr())
    del held
    assert hugepages.idle_bytes() == (5 << 20) + hugepages.HUGE


def test_idle_regions_past_the_cap_are_unmapped_least_recently_used_first(monkeypatch):
    monkeypatch.setattr(hugepages, "_regions", [])
    monkeypatch.setattr(hugepages, "IDLE_BYTES", 8 << 20)
    regions = [hugepages.region(3 << 20) for _ in range(3)]  # 5 MB mapped each
    kept = regions[2].data_ptr()
    del regions
    assert hugepages.idle_bytes() == 15 << 20  # freed, not yet trimmed: the next call trims
    big = hugepages.region(16 << 20)  # no idle one fits: a new one, after the two oldest are unmapped
    assert hugepages.idle_bytes() == 5 << 20 and len(hugepages._regions) == 2
    assert hugepages.region(3 << 20).data_ptr() == kept and big.numel() == 16 << 20  # the most recent idle one stayed
