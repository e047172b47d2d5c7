"""`specdec.kernels.kv_write`: the Triton write of new K/V rows equals its reference, and
`PagedKVCache.write` stores exactly the valid rows (padding writes nothing a reader sees)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.kernels.kv_write import kv_write_torch, kv_write_triton
from specdec.runtime.kv_cache import PagedKVCache
from tree_cases import DEVICE  # the Triton kernel needs CUDA tensors, or the interpreter on CPU


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
    region = (slots + 1) * W  # [slots + 1, W] token rows, the last a sink
    base = torch.randn(2 * region + 5, generator=gen)  # K region, V region, 5 elements of another region
    base, k, v, dst = (x.to(DEVICE) for x in (base, k, v, dst))
    ref, out = base.clone(), base.clone()
    kv_write_torch(ref, 0, region, slots, k, v, dst)
    kv_write_triton(out, 0, region, slots, k, v, dst)
    rows = lambda x, off: x[off : off + region].view(slots + 1, W)[:slots]  # noqa: E731  (the sink is never read)
    for off in (0, region):
        assert torch.equal(rows(out, off), rows(ref, off))
    assert torch.equal(out[2 * region :], base[2 * region :])  # nothing past the regions
    untouched = torch.ones(slots, dtype=torch.bool, device=DEVICE)
    untouched[dst[dst >= 0]] = False
    for off in (0, region):
        assert torch.equal(rows(out, off)[untouched], rows(base, off)[untouched])
    written = dst[dst >= 0]
    assert torch.equal(rows(out, 0)[written], k[dst >= 0].float()) and torch.equal(rows(out, region)[written], v[dst >= 0].float())


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_cache_write_stores_valid_rows_at_their_positions_only(impl):
    cache = PagedKVCache(2, [1, 2], 4, max_batch_size=2, max_seq_len=12, block_size=4, num_blocks=6,
                          device=DEVICE)
    cache.reserve(0, 8)
    cache.reserve(1, 4)
    cache.storage.normal_()
    before = [cache.k_rows(i)[:-1].clone() for i in range(2)] + [cache.v_rows(i)[:-1].clone() for i in range(2)]
    positions = torch.tensor([[5, 6, 7], [1, 2, 3]], device=DEVICE)
    valid = torch.tensor([[True, True, False], [True, False, False]], device=DEVICE)
    slots = torch.tensor([0, 1], device=DEVICE)
    index = cache.write_index(slots, positions, valid)
    k = torch.randn(2, 3, 2, 4, device=DEVICE)
    v = torch.randn(2, 3, 2, 4, device=DEVICE)
    cache.write(1, k, v, index, impl=impl)
    got_k, got_v = cache.gather(1, slots, positions)
    assert torch.equal(got_k[0, :2], k[0, :2]) and torch.equal(got_v[1, :1], v[1, :1])
    after = [cache.k_rows(i)[:-1] for i in range(2)] + [cache.v_rows(i)[:-1] for i in range(2)]
    changed = [int((a != b).sum()) for a, b in zip(after, before)]  # sink rows excluded
    assert changed == [0, 3 * 2 * 4, 0, 3 * 2 * 4]  # three rows of 2 heads x 4 dims, K and V of layer 1
