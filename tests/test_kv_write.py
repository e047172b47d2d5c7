"""`specdec.kernels.kv_write`: the Triton write of new K/V rows equals its reference, and
`PagedKVCache.write` stores exactly the valid rows (padding writes nothing a reader sees)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.kernels.kv_write import kv_write_torch, kv_write_triton
from specdec.runtime.kv_cache import PagedKVCache


@settings(max_examples=15)
@given(
    rows=st.integers(1, 9),
    heads=st.integers(1, 3),
    head_dim=st.sampled_from([4, 8, 24]),
    slots=st.integers(4, 20),
    padding=st.floats(0.0, 1.0),
    cast=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_kernel_write_equals_reference_write(rows, heads, head_dim, slots, padding, cast, seed):
    gen = torch.Generator().manual_seed(seed)
    W = heads * head_dim
    rows = min(rows, slots)
    dst = torch.randperm(slots, generator=gen)[:rows]  # distinct cache rows
    dst = torch.where(torch.rand(rows, generator=gen) < padding, -1, dst)
    qkv = torch.randn(rows, 3 * W, generator=gen, dtype=torch.float64 if cast else torch.float32)
    k, v = qkv[:, W : 2 * W], qkv[:, 2 * W :]  # strided views, as the fused projection gives them
    base = torch.randn(slots + 1, heads, head_dim, generator=gen)
    ref_k, ref_v, out_k, out_v = base.clone(), -base.clone(), base.clone(), -base.clone()
    kv_write_torch(ref_k, ref_v, k, v, dst)
    kv_write_triton(out_k, out_v, k, v, dst)
    live = slice(0, slots)  # the sink row (last) is never read
    assert torch.equal(out_k[live], ref_k[live]) and torch.equal(out_v[live], ref_v[live])
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[dst[dst >= 0]] = False
    assert torch.equal(out_k[:slots][untouched], base[:slots][untouched])


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_cache_write_stores_valid_rows_at_their_positions_only(impl):
    cache = PagedKVCache(2, [1, 2], 4, max_batch_size=2, max_seq_len=12, block_size=4, num_blocks=6)
    cache.reserve(0, 8)
    cache.reserve(1, 4)
    cache.storage.normal_()
    before = [cache.k_rows(i)[:-1].clone() for i in range(2)] + [cache.v_rows(i)[:-1].clone() for i in range(2)]
    positions = torch.tensor([[5, 6, 7], [1, 2, 3]])
    valid = torch.tensor([[True, True, False], [True, False, False]])
    index = cache.write_index(torch.tensor([0, 1]), positions, valid)
    k = torch.randn(2, 3, 2, 4)
    v = torch.randn(2, 3, 2, 4)
    cache.write(1, k, v, index, impl=impl)
    got_k, got_v = cache.gather(1, torch.tensor([0, 1]), positions)
    assert torch.equal(got_k[0, :2], k[0, :2]) and torch.equal(got_v[1, :1], v[1, :1])
    after = [cache.k_rows(i)[:-1] for i in range(2)] + [cache.v_rows(i)[:-1] for i in range(2)]
    changed = [int((a != b).sum()) for a, b in zip(after, before)]  # sink rows excluded
    assert changed == [0, 3 * 2 * 4, 0, 3 * 2 * 4]  # three rows of 2 heads x 4 dims, K and V of layer 1
