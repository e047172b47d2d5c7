"""PagedKVCache: allocation bookkeeping, clear errors, layout of the flat storage, fixed-shape writes."""

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from specdec.runtime.kv_cache import KVCacheError, PagedKVCache


def small_cache(**kw):
    args = dict(max_batch_size=3, max_seq_len=20, block_size=4, num_blocks=8)
    args.update(kw)
    return PagedKVCache(2, [2, 1], 3, **args)


def test_reserve_backs_positions_with_distinct_blocks_and_free_returns_them():
    cache = small_cache()
    cache.reserve(0, 5)
    cache.reserve(2, 4)
    cache.reserve(0, 8)  # grows in place, keeps its first two blocks
    table = cache.block_tables
    assert (table[0, :2] >= 0).all() and (table[0, 2:] == -1).all()
    assert (table[2, :1] >= 0).all() and (table[2, 1:] == -1).all() and (table[1] == -1).all()
    assert len(set(table[table >= 0].tolist())) == 3
    assert cache.capacity(0) == 8 and cache.num_free_blocks == 5
    cache.free(0)
    assert (cache.block_tables[0] == -1).all() and cache.num_free_blocks == 7


def test_request_longer_than_max_seq_len_is_a_clear_error_that_allocates_nothing():
    cache = small_cache()
    with pytest.raises(KVCacheError, match=r"21 positions.*max_seq_len=20"):
        cache.reserve(1, 21)
    assert cache.num_free_blocks == 8 and (cache.block_tables == -1).all()


def test_exhausted_pool_is_a_clear_error_and_the_request_is_not_half_allocated():
    cache = small_cache()
    cache.reserve(0, 20)  # 5 of 8 blocks
    with pytest.raises(KVCacheError, match=r"needs 4 more KV blocks.*only 3 of num_blocks=8"):
        cache.reserve(1, 16)
    assert cache.num_free_blocks == 3 and (cache.block_tables[1] == -1).all()
    cache.free(0)
    cache.reserve(1, 16)  # fits after the first request finished


@pytest.mark.parametrize("bad", [-1, 3, True, 1.0])
def test_bad_slot_names_the_value_and_the_range(bad):
    with pytest.raises(ValueError, match=r"slot=.*allowed: \[0, 3\)"):
        small_cache().reserve(bad, 4)


def test_layers_with_different_kv_heads_share_one_flat_storage():
    cache = small_cache()
    assert cache.k(0).shape == (8, 4, 2, 3) and cache.k(1).shape == (8, 4, 1, 3)
    views = [cache.k(0), cache.v(0), cache.k(1), cache.v(1)]
    for view, offset in zip(views, cache.region_offsets.tolist()):
        assert view.untyped_storage().data_ptr() == cache.storage.untyped_storage().data_ptr()
        assert view.storage_offset() == offset
    assert cache.storage.numel() == (8 * 4 + 1) * 3 * (2 + 2 + 1 + 1)  # + one sink row per region


def test_write_stores_valid_rows_at_their_block_and_never_writes_padding_rows():
    cache = small_cache()
    cache.reserve(1, 7)
    cache.reserve(0, 3)
    slots = torch.tensor([1, 0])
    positions = torch.tensor([[4, 5, 6], [2, 3, 4]])  # row 1, position 3..4: 3 is reserved, 4 is not
    valid = torch.tensor([[True, True, False], [True, True, True]])
    index = cache.write_index(slots, positions, valid)
    assert index[0, 2] == -1 and index[1, 2] == -1  # padding, and an unreserved position
    assert index[0, 0] == cache.block_tables[1, 1] * 4 + 0
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 3, 2, 3, generator=gen), torch.randn(2, 3, 2, 3, generator=gen)
    before = cache.storage.clone()
    cache.write(0, k, v, index)
    got_k, got_v = cache.gather(0, slots, positions)
    keep = index >= 0
    assert torch.equal(got_k[keep], k[keep]) and torch.equal(got_v[keep], v[keep])
    changed = (cache.storage != before).nonzero().flatten()
    per_token = 2 * 3
    written = 4 * per_token  # four valid rows, K and V each `per_token` elements
    sink_k = set(range(cache.num_tokens * per_token, (cache.num_tokens + 1) * per_token))
    sink_v = {i + cache.region_offsets[1].item() for i in sink_k}
    outside = [i for i in changed.tolist() if i not in sink_k | sink_v]
    assert len(outside) == 2 * written
    assert torch.equal(cache.k(1), torch.zeros_like(cache.k(1)))  # other layer untouched


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 24)), min_size=1, max_size=40))
def test_random_reserve_free_sequences_never_share_or_lose_a_block(ops):
    note(ops)
    cache = PagedKVCache(1, 1, 2, max_batch_size=4, max_seq_len=24, block_size=3, num_blocks=12)
    for slot, n in ops:
        if n < 0:
            cache.free(slot)
            continue
        try:
            cache.reserve(slot, n)
        except KVCacheError:
            pass
        assert cache.capacity(slot) >= n or cache.num_free_blocks < -(-n // 3) - cache.capacity(slot) // 3
    owned = cache.block_tables[cache.block_tables >= 0].tolist()
    assert len(owned) == len(set(owned))
    assert sorted(owned + cache.allocator._free_blocks) == list(range(12))
    for slot in range(4):  # each row is a prefix of allocated blocks followed by -1
        row = cache.block_tables[slot]
        n = int((row >= 0).sum())
        assert (row[:n] >= 0).all() and (row[n:] == -1).all() and cache.capacity(slot) == 3 * n


@pytest.mark.parametrize("rotated", [False, True])
def test_compiled_writes_keep_the_storage_in_place(rotated):
    """Under torch.compile, K/V writes followed by reads of the cache must mutate the one
    storage in place: no graph input may alias it (per-layer views kept as attributes did, and
    AOTAutograd then functionalized every write into a copy of the whole storage, a
    `as_strided_scatter` over hundreds of MB per write on an 8B target). Checked on the
    functionalized graph (aot_eager), and the compiled writes equal the eager ones."""
    from torch._functorch.aot_autograd import aot_module_simplified

    from specdec.models.fused import rotary_qk

    graphs = []

    def backend(gm, inputs):
        def keep(graph, _inputs):
            graphs.append(graph)
            return graph

        return aot_module_simplified(gm, inputs, fw_compiler=keep)

    def make():
        cache = PagedKVCache(2, [1, 2], 4, max_batch_size=1, max_seq_len=8, block_size=4)
        cache.reserve(0, 8)
        return cache

    def run(cache, k, v, q, cos, sin, index):
        out = []
        for layer in range(2):
            heads = cache.num_kv_heads[layer]
            if rotated:
                out.append(cache.write_rotated(layer, q, k[..., :heads, :], v[..., :heads, :], cos, sin, index,
                                               rotary=rotary_qk, impl="ref"))
            else:
                cache.write(layer, k[..., :heads, :], v[..., :heads, :], index, impl="ref")
            out.append(cache.k(layer).sum() + cache.v_rows(layer).sum())
        return out

    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 1, 3, 2, 4, generator=gen)
    q = torch.randn(1, 3, 2, 4, generator=gen)
    cos, sin = torch.randn(2, 1, 3, 1, 4, generator=gen)
    index = torch.tensor([[1, 2, -1]])
    eager, compiled = make(), make()
    want = run(eager, k, v, q, cos, sin, index)
    got = torch.compile(lambda *a: run(compiled, *a), backend=backend, fullgraph=True)(k, v, q, cos, sin, index)
    assert graphs, "nothing was compiled"
    ops = [str(node.target) for g in graphs for node in g.graph.nodes if node.op == "call_function"]
    assert not [op for op in ops if "as_strided_scatter" in op], ops
    assert torch.equal(compiled.storage, eager.storage)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
