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
