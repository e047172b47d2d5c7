"""build_tree: mask rows, depths, child/sibling lists, padding and buffer reuse, for the
PyTorch reference and the Triton kernel (interpreted on CPU), checked against parent walks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from specdec.ops import build_tree, check_tree
from specdec.types import TreeMeta
from specdec.testing.check_trees import check_tree_meta  # the kit's oracle: mask, positions, siblings, retrieve
from tree_cases import DEVICE as device
from tree_cases import ci_examples, kernel_sizes, make_trees, trees

KERNEL_BATCH, KERNEL_SLOTS = kernel_sizes(full=(8, 256), small=(3, 70))
IMPLS = ["ref", "triton"]


def _sizes(impl: str) -> dict:
    return dict(max_batch=KERNEL_BATCH, max_slots=KERNEL_SLOTS) if impl == "triton" else dict(max_batch=8, max_slots=256)


@pytest.mark.parametrize("impl", IMPLS)
@given(data=st.data())
def test_tree_meta_matches_the_parent_walk(impl, data):
    case = data.draw(trees(**_sizes(impl)))
    note(f"seed={case.seed} shape={case.shape} B={case.batch} N={case.slots} num_nodes={case.num_nodes.tolist()}")
    meta = build_tree(case.parents.to(device), case.num_nodes.to(device), impl=impl)
    check_tree_meta(case, meta)


@given(case=trees(max_batch=KERNEL_BATCH, max_slots=KERNEL_SLOTS))
def test_kernel_equals_reference_bit_for_bit(case):
    note(f"seed={case.seed} shape={case.shape} B={case.batch} N={case.slots}")
    parents, num_nodes = case.parents.to(device), case.num_nodes.to(device)
    ref = build_tree(parents, num_nodes, impl="ref")
    ker = build_tree(parents, num_nodes, impl="triton")
    for name in ("packed_mask", "positions", "next_token", "next_sibling", "retrieve_index"):
        assert torch.equal(getattr(ref, name), getattr(ker, name)), name


@pytest.mark.parametrize("impl", IMPLS)
@ci_examples(6, gpu=200)
@given(seed=st.integers(0, 2**31 - 1), shallow=st.sampled_from(["star", "random", "layered"]))
def test_deep_tree_then_shallow_tree_in_the_same_buffers_leaves_no_stale_bit(impl, seed, shallow):
    B, N = (KERNEL_BATCH, KERNEL_SLOTS) if impl == "triton" else (8, 256)
    buf = TreeMeta.empty(B, N, device=device)
    for t in (buf.packed_mask, buf.positions, buf.next_token, buf.next_sibling, buf.retrieve_index):
        t.fill_(-1)  # every bit set, every link pointing somewhere
    deep = make_trees(B, N, "chain", seed, padded=False)
    build_tree(deep.parents.to(device), deep.num_nodes.to(device), out=buf, impl=impl)
    case = make_trees(B, N, shallow, seed + 1, padded=True)
    out = build_tree(case.parents.to(device), case.num_nodes.to(device), out=buf, impl=impl)
    assert out is buf
    check_tree_meta(case, buf)


@pytest.mark.parametrize("impl", IMPLS)
def test_bit_31_is_packed_as_the_sign_of_an_int32_word(impl):
    parents = torch.tensor([[-1] + list(range(34))], device=device)  # a chain of 35
    meta = build_tree(parents, torch.tensor([35], device=device), impl=impl)
    words = meta.packed_mask[0].cpu()
    assert words[31].tolist() == [-1, 0]  # bits 0..31: all set
    assert words[30].tolist() == [2**31 - 1, 0]
    assert words[34].tolist() == [-1, 7]
    assert meta.positions[0].tolist() == list(range(35))


@pytest.mark.parametrize("impl", IMPLS)
def test_garbage_parents_of_padding_rows_are_ignored(impl):
    case = make_trees(4, 40, "random", seed=7, padded=True)
    case.num_nodes[0] = 5
    clean = case.parents.clone()
    clean[torch.arange(40)[None, :] >= case.num_nodes[:, None]] = -1
    a = build_tree(case.parents.to(device), case.num_nodes.to(device), impl=impl)
    b = build_tree(clean.to(device), case.num_nodes.to(device), impl=impl)
    for name in ("packed_mask", "positions", "next_token", "next_sibling", "retrieve_index"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_check_tree_names_the_bad_entry():
    ok = torch.tensor([[-1, 0, 1, 9]])
    check_tree(ok, torch.tensor([3]))  # the padding entry 9 is not checked
    with pytest.raises(ValueError, match=r"parents\[0, 2\]=2 .* allowed: \[0, 2\)"):
        check_tree(torch.tensor([[-1, 0, 2]]), torch.tensor([3]))
    with pytest.raises(ValueError, match=r"num_nodes\[0\]=0 .* allowed: \[1, 3\]"):
        check_tree(torch.tensor([[-1, 0, 1]]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"root's parent must be -1"):
        check_tree(torch.tensor([[0, 0, 1]]), torch.tensor([3]))
    with pytest.raises(ValueError, match=r"parents\[0, 1\]=2"):
        build_tree(torch.tensor([[-1, 2, 0]]), torch.tensor([3]), check=True)


def test_build_tree_rejects_mismatched_out_buffers():
    with pytest.raises(ValueError, match="out.packed_mask"):
        build_tree(torch.tensor([[-1, 0]]), torch.tensor([2]), out=TreeMeta.empty(1, 3))
    with pytest.raises(ValueError, match="impl='cuda' is unknown"):
        build_tree(torch.tensor([[-1, 0]]), torch.tensor([2]), impl="cuda")
