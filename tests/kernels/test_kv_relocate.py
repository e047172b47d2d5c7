"""KV relocation: Triton kernel == torch gather/scatter reference == a naive per-token loop.

Random paged layouts (block sizes, interleaved block tables, per-layer KV heads), random
accept paths (increasing tree paths that overlap their destinations, e.g. [0, 2, 3], and
arbitrary permutations), bitwise equality of the WHOLE storage, so nothing outside the
moved positions may change.
"""


import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from specdec import SpecConfig
from specdec.kernels.kv_relocate import relocate_kv, relocate_kv_naive
from specdec.plugins.relocate import specdec_relocate_kv
from specdec.runtime.kv_cache import PagedKVCache


def make_cache(heads, head_dim, block_size, batch, seq_len, seed, device, dtype=torch.float32):
    cache = PagedKVCache(
        len(heads), heads, head_dim, max_batch_size=batch, max_seq_len=seq_len,
        block_size=block_size, device=device, dtype=dtype,
    )
    # interleave the slots' blocks so block tables are not contiguous runs
    for end in range(block_size, seq_len + block_size, block_size):
        for slot in reversed(range(batch)):
            cache.reserve(slot, min(end, seq_len))
    gen = torch.Generator().manual_seed(seed)
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=gen).to(dtype))
    return cache


def clone_cache(cache):
    other = make_cache(cache.num_kv_heads, cache.head_dim, cache.block_size, cache.max_batch_size,
                       cache.max_seq_len, 0, cache.storage.device, cache.dtype)
    other.block_tables.copy_(cache.block_tables)
    other.storage.copy_(cache.storage)
    return other


@st.composite
def relocation_cases(draw):
    layers = draw(st.integers(1, 3))
    heads = draw(st.lists(st.integers(1, 3), min_size=layers, max_size=layers))
    head_dim = draw(st.integers(1, 9))
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    batch = draw(st.integers(1, 3))
    n = draw(st.integers(1, 12))
    width = draw(st.integers(1, n))  # accept_nodes may be narrower than N (plugin slices D + 1)
    committed, nodes, lengths = [], [], []
    for _ in range(batch):
        committed.append(draw(st.integers(0, 20)))
        if draw(st.booleans()):  # a tree path: increasing, node j >= j (the real case)
            length = draw(st.integers(0, width - 1))
            picked = sorted(draw(st.sets(st.integers(1, n - 1), min_size=length, max_size=length))) if n > 1 else []
            path = [0] + picked
        else:  # any permutation of distinct nodes: gather-then-scatter must still hold
            path = draw(st.permutations(range(n)))[:width]
            length = draw(st.integers(0, width - 1))
        lengths.append(length)
        nodes.append((list(path) + [-1] * width)[:width])
    seq_len = 20 + n + draw(st.integers(0, 5))
    return dict(heads=heads, head_dim=head_dim, block_size=block_size, batch=batch, seq_len=seq_len,
                committed=committed, nodes=nodes, lengths=lengths, seed=draw(st.integers(0, 2**16)))


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run_all(case, device, dtype=torch.float32):
    cache = make_cache(case["heads"], case["head_dim"], case["block_size"], case["batch"], case["seq_len"],
                       case["seed"], device, dtype)
    args = [torch.tensor(case[k], dtype=torch.int64, device=device) for k in ("committed", "nodes", "lengths")]
    naive, reference = clone_cache(cache), clone_cache(cache)
    relocate_kv_naive(naive, *args)
    relocate_kv(reference, *args, impl="torch")
    relocate_kv(cache, *args, impl="triton")
    return cache, reference, naive


@given(relocation_cases())
def test_relocation_kernel_equals_reference_and_naive_loop_bitwise(case):
    note(case)
    kernel, reference, naive = run_all(case, DEVICE)
    assert torch.equal(reference.storage, naive.storage)
    assert torch.equal(kernel.storage, naive.storage)


def test_overlapping_path_0_2_3_reads_before_it_writes(device):
    case = dict(heads=[2, 1], head_dim=4, block_size=2, batch=1, seq_len=16,
                committed=[3], nodes=[[0, 2, 3, -1]], lengths=[2], seed=1)
    before = make_cache(case["heads"], 4, 2, 1, 16, 1, device)
    kernel, reference, naive = run_all(case, device)
    slot, positions = torch.tensor([0], device=device), torch.arange(16, device=device)[None]
    for layer in range(2):
        for old, new in zip(before.gather(layer, slot, positions), kernel.gather(layer, slot, positions)):
            old, new = old[0], new[0]  # [16, Hkv, hd] by logical position
            assert torch.equal(new[4], old[5])  # node 2 -> position 3 + 1 (crosses a block boundary)
            assert torch.equal(new[5], old[6])  # node 3 -> position 3 + 2, read before 5 was overwritten
            assert torch.equal(new[:4], old[:4]) and torch.equal(new[6:], old[6:])
    assert torch.equal(kernel.storage, naive.storage)


def test_rows_with_accept_length_zero_are_untouched(device):
    case = dict(heads=[1, 3], head_dim=5, block_size=4, batch=2, seq_len=24,
                committed=[5, 0], nodes=[[0, 3, 4], [0, 1, 2]], lengths=[0, 0], seed=2)
    before = make_cache(case["heads"], 5, 4, 2, 24, 2, device)
    kernel, _, _ = run_all(case, device)
    assert torch.equal(kernel.storage, before.storage)


def test_relocation_in_bfloat16_is_bitwise(device):
    case = dict(heads=[2, 1, 2], head_dim=8, block_size=4, batch=2, seq_len=32,
                committed=[7, 1], nodes=[[0, 1, 5, 6], [0, 4, 9, 11]], lengths=[3, 2], seed=3)
    kernel, reference, naive = run_all(case, device, torch.bfloat16)
    assert torch.equal(kernel.storage, naive.storage) and torch.equal(reference.storage, naive.storage)


def test_plugin_returns_a_relocator_that_reads_only_the_first_depth_plus_one_nodes(device):
    relocator = specdec_relocate_kv(SpecConfig(max_draft_len=2))
    cache = make_cache([2], 4, 4, 1, 24, 4, device)
    expected = clone_cache(cache)
    committed = torch.tensor([2], device=device)
    nodes = torch.tensor([[0, 3, 5, 7, 8, 9]], device=device)  # entries past D + 1 = 3 are garbage here
    length = torch.tensor([2], device=device)
    relocator(cache, committed, nodes, length)
    relocate_kv_naive(expected, committed, nodes[:, :3], length)
    assert torch.equal(cache.storage, expected.storage)


def test_reference_compiles_without_graph_breaks(device):
    """On the device the step runs on (on the GPU machine a CPU compile of this only repeated
    CI's, and under the property part's 8 workers its C++ build took 184 s)."""
    cache = make_cache([2, 1], 4, 4, 2, 24, 5, device)
    expected = clone_cache(cache)
    args = tuple(t.to(device) for t in (torch.tensor([1, 4]), torch.tensor([[0, 2, 3], [0, 1, 5]]), torch.tensor([2, 2])))
    step = torch.compile(lambda c, n, a: relocate_kv(cache, c, n, a, impl="torch"), fullgraph=True)
    step(*args)
    relocate_kv_naive(expected, *args)
    assert torch.equal(cache.storage, expected.storage)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.compile traces Triton kernels only when compiled for a GPU")
def test_kernel_compiles_without_graph_breaks_and_no_recompile_for_new_values():
    cache = make_cache([8, 4], 16, 16, 4, 96, 6, "cuda")
    expected = clone_cache(cache)
    step = torch.compile(lambda c, n, a: relocate_kv(cache, c, n, a, impl="triton"), fullgraph=True)
    for seed in range(2):
        gen = torch.Generator().manual_seed(seed)
        committed = torch.randint(0, 40, (4,), generator=gen).cuda()
        nodes = torch.sort(torch.randperm(30, generator=gen)[:5] + 1).values
        nodes = torch.cat([torch.zeros(1, dtype=torch.int64), nodes])[None].repeat(4, 1).cuda()
        length = torch.randint(0, 6, (4,), generator=gen).cuda()
        with torch._dynamo.config.patch(error_on_recompile=seed > 0):
            step(committed, nodes, length)
        relocate_kv_naive(expected, committed, nodes, length)
        assert torch.equal(cache.storage, expected.storage)



def test_a_root_only_path_launches_no_relocation(device, monkeypatch):
    """Target-only and plain steps verify root-only trees: their one-entry path is the root,
    already at committed_len, so the relocator launches nothing (and the cache is untouched)."""
    import specdec.plugins.relocate as plugin

    relocator = specdec_relocate_kv(SpecConfig(max_draft_len=2))
    cache = make_cache([2], 4, 4, 1, 24, 4, device)
    before = cache.storage.clone()
    monkeypatch.setattr(plugin, "relocate_kv", lambda *a, **k: pytest.fail("relocate_kv ran for a root-only path"))
    relocator(cache, torch.tensor([3], device=device), torch.zeros(1, 1, dtype=torch.int64, device=device),
              torch.zeros(1, dtype=torch.int64, device=device))
    assert torch.equal(cache.storage, before)
    with pytest.raises(pytest.fail.Exception):  # a real path still relocates
        relocator(cache, torch.tensor([3], device=device), torch.tensor([[0, 2, 3]], device=device),
                  torch.tensor([2], device=device))
