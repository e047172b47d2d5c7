"""verify_greedy: equals a naive Python walk over parent pointers; kernel == reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from specdec.ops import build_tree, verify_greedy
from specdec.kernels.verify_greedy import verify_greedy_triton
from tree_cases import DEVICE as device
from tree_cases import children_lists, ci_examples, kernel_sizes, naive_greedy_walk, trees

KERNEL_BATCH, KERNEL_SLOTS = kernel_sizes(full=(8, 256), small=(4, 70))


def greedy_case(case, vocab: int, seed: int, logit_dtype=torch.float32):
    """Tokens and logits for deep walks: at most nodes the argmax is some child's token;
    small-integer logits elsewhere (ties); duplicate sibling tokens are common."""
    g = torch.Generator().manual_seed(seed)
    B, N = case.batch, case.slots
    tokens = torch.randint(0, min(vocab, 6), (B, N), generator=g)
    logits = torch.randint(-3, 3, (B, N, vocab), generator=g).float()
    pick = torch.rand(B, N, generator=g).tolist()
    for b in range(B):
        kids = children_lists(case.parents[b].tolist(), int(case.num_nodes[b]))
        for u, k in enumerate(kids):
            if k and pick[b][u] < 0.85:
                logits[b, u, tokens[b, k[int(pick[b][u] * 1000) % len(k)]]] = 9.0
    return tokens, logits.to(logit_dtype)


def _assert_walk(case, tokens, logits, acc) -> None:
    argmax = logits.float().argmax(-1).tolist()
    for b in range(case.batch):
        n = int(case.num_nodes[b])
        path, emitted = naive_greedy_walk(case.parents[b].tolist(), n, tokens[b].tolist(), argmax[b])
        a = len(path) - 1
        assert int(acc.accept_length[b]) == a
        assert acc.accept_nodes[b].tolist() == path + [-1] * (case.slots - a - 1)
        assert acc.accept_tokens[b].tolist() == emitted + [-1] * (case.slots - a - 1)


@pytest.mark.parametrize("impl", ["ref", "triton"])
@given(data=st.data())
def test_greedy_verification_equals_the_naive_python_walk(impl, data):
    max_batch, max_slots = (KERNEL_BATCH, KERNEL_SLOTS) if impl == "triton" else (8, 256)
    case = data.draw(trees(max_batch=max_batch, max_slots=max_slots))
    vocab = data.draw(st.sampled_from([2, 3, 17, 64, 130]))
    seed = data.draw(st.integers(0, 2**31 - 1))
    note(f"seed={case.seed}/{seed} shape={case.shape} B={case.batch} N={case.slots} V={vocab}")
    tokens, logits = greedy_case(case, vocab, seed)
    tree = build_tree(case.parents.to(device), case.num_nodes.to(device), impl="ref")
    acc = verify_greedy(tokens.to(device), tree, logits.to(device), impl=impl)
    _assert_walk(case, tokens, logits, acc.__class__(*(t.cpu() for t in vars(acc).values())))


@ci_examples(10, gpu=300)
@given(case=trees(max_batch=KERNEL_BATCH, max_slots=KERNEL_SLOTS), vocab=st.sampled_from([3, 17, 8195]), seed=st.integers(0, 2**31 - 1))
def test_greedy_kernel_equals_reference_on_logits_and_on_argmax(case, vocab, seed):
    note(f"seed={case.seed}/{seed} shape={case.shape} B={case.batch} N={case.slots} V={vocab}")
    tokens, logits = greedy_case(case, vocab, seed, logit_dtype=torch.bfloat16)
    tokens, logits = tokens.to(device), logits.to(device)
    tree = build_tree(case.parents.to(device), case.num_nodes.to(device), impl="ref")
    ref = verify_greedy(tokens, tree, logits, impl="ref")
    walk = (tokens, tree.next_token.contiguous(), tree.next_sibling.contiguous())
    for target in (logits, logits.argmax(-1)):  # the kernel itself: its in-walk argmax, and a given one
        ker = verify_greedy_triton(*walk, target.contiguous())
        for name, got in zip(("accept_length", "accept_nodes", "accept_tokens"), ker):
            assert torch.equal(getattr(ref, name), got), name
    op = verify_greedy(tokens, tree, logits, impl="triton")  # the op: every row's argmax first when N > 1
    for name in ("accept_length", "accept_nodes", "accept_tokens"):
        assert torch.equal(getattr(ref, name), getattr(op, name)), name


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_ties_go_to_the_lowest_token_and_duplicate_siblings_to_the_first(impl):
    parents = torch.tensor([[-1, 0, 0, 0, 3]], device=device)
    tree = build_tree(parents, torch.tensor([5], device=device))
    tokens = torch.tensor([[9, 2, 1, 1, 4]], device=device)  # nodes 2 and 3 both carry token 1
    logits = torch.zeros(1, 5, 8, device=device)
    logits[0, 0, [1, 5]] = 3.0  # tie between tokens 1 and 5 at the root -> 1
    logits[0, 2, 6] = 1.0  # node 2 (the first sibling with token 1) -> bonus 6
    logits[0, 3, 4] = 1.0  # would continue to node 4 had node 3 been taken
    acc = verify_greedy(tokens, tree, logits, impl=impl)
    assert acc.accept_length.tolist() == [1]
    assert acc.accept_nodes[0].tolist() == [0, 2, -1, -1, -1]
    assert acc.accept_tokens[0].tolist() == [1, 6, -1, -1, -1]


def test_greedy_rejects_a_target_of_the_wrong_shape():
    tree = build_tree(torch.tensor([[-1, 0]]), torch.tensor([2]))
    with pytest.raises(ValueError, match=r"argmax target must be \[1, 2\] int64"):
        verify_greedy(torch.tensor([[1, 2]]), tree, torch.tensor([[1, 2]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"target logits must be \[1, 2, V\]"):
        verify_greedy(torch.tensor([[1, 2]]), tree, torch.zeros(1, 3, 5))


def test_the_op_takes_every_rows_argmax_first_only_for_small_multi_node_logits(monkeypatch):
    """`ops.verify_greedy` on logits: N > 1 and at most ARGMAX_FIRST_MAX_ELEMENTS elements ->
    the kernel gets the [B, N] argmax (one wide reduction); one node, or larger logits -> the
    kernel's in-walk argmax. The acceptance is the reference's either way."""
    from specdec.ops import verify as verify_mod

    seen = []
    real = verify_mod.verify_greedy_triton

    def spy(tokens, next_token, next_sibling, target):
        seen.append(target.dim())
        return real(tokens, next_token, next_sibling, target)

    monkeypatch.setattr(verify_mod, "verify_greedy_triton", spy)
    parents = torch.tensor([[-1, 0, 1, 0]], device=device)
    tree = build_tree(parents, torch.tensor([4], device=device))
    tokens = torch.tensor([[0, 3, 5, 2]], device=device)
    logits = torch.randn(1, 4, 7, generator=torch.Generator().manual_seed(0)).to(device)
    logits[0, 0, 3] = logits[0, 1, 5] = 9.0  # the path 0 -> 1 -> 2, then a bonus
    ref = verify_greedy(tokens, tree, logits, impl="ref")
    for limit, want in ((logits.numel(), 2), (logits.numel() - 1, 3)):
        monkeypatch.setattr(verify_mod, "ARGMAX_FIRST_MAX_ELEMENTS", limit)
        got = verify_greedy(tokens, tree, logits, impl="triton")
        assert seen[-1] == want and got.accept_tokens.tolist() == ref.accept_tokens.tolist()
    one = build_tree(torch.tensor([[-1]], device=device), torch.tensor([1], device=device))
    verify_greedy(tokens[:, :1], one, logits[:, :1], impl="triton")
    assert seen[-1] == 3 and ref.accept_length.tolist() == [2]
