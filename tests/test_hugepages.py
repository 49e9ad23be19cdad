"""engine/platform/hugepages.py: tensors gathered into one region keep their values, shapes and dtypes,
start on their alignment, and the region is counted once at its own size; a w8a variant's weights
live there and its products are unchanged."""

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
