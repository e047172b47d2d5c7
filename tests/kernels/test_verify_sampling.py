"""verify_target_only / verify_speculative: kernel == reference draw for draw, greedy rows
give the greedy walk, emitted tokens stay in the target's support, draws replay.
(Their output distributions are tested in test_sampling_distribution.py.)"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from specdec.ops import build_tree, verify_greedy, verify_speculative, verify_target_only
from tree_cases import DEVICE as device
from tree_cases import children_lists, ci_examples, kernel_sizes, make_trees, trees

KERNEL_BATCH, KERNEL_SLOTS = kernel_sizes(full=(8, 256), small=(4, 48))
VOCABS = [2, 3, 17, 64, 4099]  # 4099: two vocab blocks in the kernels


def _dist(g, shape, sparsity: float) -> torch.Tensor:
    """Random distributions over the last axis with exact zeros (the max entry is kept)."""
    p = (torch.randn(shape, generator=g) * 2).softmax(-1)
    keep = (torch.rand(shape, generator=g) >= sparsity) | (p == p.amax(-1, keepdim=True))
    p = p * keep
    return p / p.sum(-1, keepdim=True)


def _boost(g, case, tokens, p, mass: float, prob: float) -> torch.Tensor:
    """Move `mass` onto some child's token at most nodes, so walks go deep."""
    p = p.clone()
    pick = torch.rand(case.batch, case.slots, generator=g).tolist()
    for b in range(case.batch):
        for u, k in enumerate(children_lists(case.parents[b].tolist(), int(case.num_nodes[b]))):
            if k and pick[b][u] < prob:
                p[b, u, tokens[b, k[int(pick[b][u] * 997) % len(k)]]] += mass
    return p / p.sum(-1, keepdim=True)


def sampling_case(case, vocab: int, seed: int):
    """(tokens, target_probs, draft_probs) on CPU: duplicates, zeros, q(x) = 0 drafts."""
    g = torch.Generator().manual_seed(seed)
    B, N = case.batch, case.slots
    tokens = torch.randint(0, min(vocab, 6), (B, N), generator=g)
    target = _boost(g, case, tokens, _dist(g, (B, N, vocab), 0.3), mass=3.0, prob=0.8)
    draft = _boost(g, case, tokens, _dist(g, (B, N, vocab), 0.5), mass=2.0, prob=0.6)
    return tokens, target, draft


def _run(verifier: str, tokens, tree, target, draft, impl, **kw):
    if verifier == "target-only":
        return verify_target_only(tokens, tree, target, impl=impl, **kw)
    return verify_speculative(tokens, tree, target, draft, impl=impl, **kw)


def _equal(a, b) -> None:
    for name in ("accept_length", "accept_nodes", "accept_tokens"):
        assert torch.equal(getattr(a, name), getattr(b, name)), (name, getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("verifier", ["target-only", "speculative"])
@ci_examples(12, gpu=300)
@given(
    case=trees(max_batch=KERNEL_BATCH, max_slots=KERNEL_SLOTS),
    vocab=st.sampled_from(VOCABS),
    seed=st.integers(0, 2**31 - 1),
    u_dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_sampling_kernel_equals_reference_draw_for_draw(verifier, case, vocab, seed, u_dtype):
    note(f"seed={case.seed}/{seed} shape={case.shape} B={case.batch} N={case.slots} V={vocab}")
    tokens, target, draft = (t.to(device) for t in sampling_case(case, vocab, seed))
    tree = build_tree(case.parents.to(device), case.num_nodes.to(device), impl="ref")
    u = torch.rand(case.batch, case.slots, 2, generator=torch.Generator().manual_seed(seed), dtype=u_dtype).to(device)
    ref = _run(verifier, tokens, tree, target, draft, "ref", uniforms=u)
    ker = _run(verifier, tokens, tree, target, draft, "triton", uniforms=u)
    note(f"accept_length={ref.accept_length.tolist()}")
    _equal(ref, ker)


@pytest.mark.parametrize("verifier", ["target-only", "speculative"])
@pytest.mark.parametrize("seed", range(2))
def test_sampling_kernel_equals_reference_through_long_runs_of_rejected_siblings(verifier, seed):
    """Stars whose children the target dislikes: each node sees many residual updates."""
    case = make_trees(4, 16, "star", seed=seed, padded=False)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randperm(40, generator=g)[:16].repeat(4, 1)  # distinct siblings
    target = _dist(g, (4, 16, 40), 0.2)
    target[:, 0, tokens[0, 1:]] *= 0.05  # the children carry little target mass ...
    draft = _dist(g, (4, 16, 40), 0.0)
    draft[:, 0, tokens[0, 1:]] += 0.5  # ... and much draft mass
    target, draft = target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True)
    tokens, target, draft = tokens.to(device), target.to(device), draft.to(device)
    tree = build_tree(case.parents.to(device), case.num_nodes.to(device), impl="ref")
    for trial in range(3):
        u = torch.rand(4, 16, 2, generator=g, dtype=torch.float64).to(device)
        ref = _run(verifier, tokens, tree, target, draft, "ref", uniforms=u)
        _equal(ref, _run(verifier, tokens, tree, target, draft, "triton", uniforms=u))


@pytest.mark.parametrize("impl", ["ref", "triton"])
@pytest.mark.parametrize("verifier", ["target-only", "speculative"])
@ci_examples(8, gpu=150)
@given(data=st.data())
def test_greedy_rows_reduce_to_the_greedy_walk(verifier, impl, data):
    max_batch, max_slots = (KERNEL_BATCH, KERNEL_SLOTS) if impl == "triton" else (8, 128)
    case = data.draw(trees(max_batch=max_batch, max_slots=max_slots))
    vocab, seed = data.draw(st.sampled_from([3, 17, 64])), data.draw(st.integers(0, 2**31 - 1))
    tokens, target, draft = sampling_case(case, vocab, seed)
    one_hot = torch.zeros_like(target).scatter_(-1, target.argmax(-1, keepdim=True), 1.0)
    if data.draw(st.booleans()):
        draft = torch.zeros_like(draft).scatter_(-1, draft.argmax(-1, keepdim=True), 1.0)  # greedy drafter
    tokens, one_hot, draft = tokens.to(device), one_hot.to(device), draft.to(device)
    tree = build_tree(case.parents.to(device), case.num_nodes.to(device), impl="ref")
    want = verify_greedy(tokens, tree, one_hot, impl="ref")
    got = _run(verifier, tokens, tree, one_hot, draft, impl, generator=torch.Generator(device).manual_seed(seed))
    _equal(want, got)


@pytest.mark.parametrize("verifier", ["target-only", "speculative"])
@given(case=trees(max_batch=8, max_slots=64), seed=st.integers(0, 2**31 - 1))
def test_emitted_tokens_lie_on_a_tree_path_and_in_the_target_support(verifier, case, seed):
    tokens, target, draft = sampling_case(case, 17, seed)
    tree = build_tree(case.parents, case.num_nodes, impl="ref")
    acc = _run(verifier, tokens, tree, target, draft, "ref", generator=torch.Generator().manual_seed(seed))
    for b in range(case.batch):
        a = int(acc.accept_length[b])
        path, emitted = acc.accept_nodes[b].tolist(), acc.accept_tokens[b].tolist()
        assert path[0] == 0 and path[a + 1 :] == [-1] * (case.slots - a - 1)
        assert emitted[a + 1 :] == [-1] * (case.slots - a - 1)
        parents = case.parents[b].tolist()
        for k in range(1, a + 1):
            assert parents[path[k]] == path[k - 1] and path[k] < int(case.num_nodes[b])
            assert emitted[k - 1] == int(tokens[b, path[k]])
        for k in range(a + 1):  # every emitted token has target mass at the node it was drawn at
            assert target[b, path[k], emitted[k]] > 0, (b, k)
        if verifier == "target-only":  # the correction avoids every (rejected) child's token
            last = path[a]
            kids = children_lists(parents, int(case.num_nodes[b]))[last]
            assert emitted[a] not in {int(tokens[b, c]) for c in kids}


@pytest.mark.parametrize("verifier", ["target-only", "speculative"])
def test_a_generator_replays_its_draws_and_equals_explicit_uniforms(verifier):
    case = make_trees(6, 20, "layered", seed=3)
    tokens, target, draft = sampling_case(case, 17, seed=4)
    tree = build_tree(case.parents, case.num_nodes, impl="ref")
    runs = [_run(verifier, tokens, tree, target, draft, "ref", generator=torch.Generator().manual_seed(11)) for _ in range(2)]
    u = torch.rand(6, 20, 2, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    explicit = _run(verifier, tokens, tree, target, draft, "ref", uniforms=u)
    _equal(runs[0], runs[1])
    _equal(runs[0], explicit)


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_a_draft_token_with_zero_draft_probability_is_accepted_iff_the_target_allows_it(impl):
    tree = build_tree(torch.tensor([[-1, 0]] * 3, device=device), torch.tensor([2] * 3, device=device), impl="ref")
    tokens = torch.tensor([[0, 1], [0, 2], [0, 3]], device=device)  # x = 1: p > 0 = q; 2: p = 0 < q; 3: p = q = 0
    target = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25] * 4], device=device).expand(3, 2, 4).contiguous()
    draft = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.25] * 4], device=device).expand(3, 2, 4).contiguous()
    for coin in (0.0, 0.5, 1 - 2**-53):
        u = torch.full((3, 2, 2), coin, dtype=torch.float64, device=device)
        acc = verify_speculative(tokens, tree, target, draft, uniforms=u, impl=impl)
        assert acc.accept_length.tolist() == [1, 0, 0]
        assert acc.accept_tokens[1:, 0].tolist() == [0 if coin < 0.5 else 1] * 2  # from p (= max(p - q, 0) here)


def test_sampling_verifiers_reject_bad_arguments():
    case = make_trees(2, 5, "chain", seed=0, padded=False)
    tokens, target, draft = sampling_case(case, 7, seed=0)
    tree = build_tree(case.parents, case.num_nodes, impl="ref")
    with pytest.raises(ValueError, match="either uniforms= .* or generator="):
        verify_target_only(tokens, tree, target, uniforms=torch.rand(2, 5, 2), generator=torch.Generator())
    with pytest.raises(ValueError, match=r"uniforms must be \[2, 5, 2\] float32 or float64"):
        verify_target_only(tokens, tree, target, uniforms=torch.rand(2, 5))
    with pytest.raises(ValueError, match=r"draft_probs must be float \(2, 5, 7\)"):
        verify_speculative(tokens, tree, target, draft[:, :, :6])
    with pytest.raises(ValueError, match=r"target_probs must be \[2, 5, V\] float"):
        verify_target_only(tokens, tree, target[:1])
