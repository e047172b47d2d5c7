"""The sampling verifiers are exact: emitted tokens follow the target distribution.

Each check runs `n` independent trials of one tree as one batch and compares the empirical
law of the emitted token(s) with the exact law (float64) in total-variation distance, under

    tau(K, n) = 1/2 sqrt((K - 1) / n) + sqrt(ln(1 / delta) / (2 n)) + eps
              (bound on E[TV])        (McDiarmid, each trial moves TV by <= 1/n)

with K categories, delta = 1e-6 (chance that a correct verifier fails one assertion) and
eps = 1e-4 slack for float32 probabilities. Numbers for the CPU sizes (n = 2^16):
K = 16 -> tau = 0.0179; joint of two tokens, K = 64, n = 2^17 -> tau = 0.0183.
Deliberately broken verifiers (no residual renormalization; recovery from p instead of
max(p - q, 0)) must fail the same assertion, and do, by a wide margin.

Seeds are drawn by hypothesis (derandomized under the `ci` profile, so CI is deterministic).
On CPU the trials run through the PyTorch reference; on CUDA through the Triton kernels
(impl="auto"); `test_verify_sampling` ties the two together draw for draw.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from specdec.ops import build_tree, sample_from_probs, verify_speculative, verify_target_only
from specdec.types import TreeMeta
from specdec.testing.oracles import DELTA, EPS_NUM, assert_follows  # the kit's thresholds (tv_bound)
from specdec.testing.strategies import random_distributions, random_tree_parents
from tree_cases import DEVICE, ON_GPU, children_lists, ci_examples

TRIALS = 2**20 if ON_GPU else 2**16
IMPL = "auto" if ON_GPU else "ref"


def _law(p: torch.Tensor) -> torch.Tensor:
    p = p.double()
    return p / p.sum()


def _replicate(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.to(DEVICE).expand(n, *x.shape).contiguous()


def _tree(parents: list[int], n: int) -> TreeMeta:
    """One tree, built once and replicated over n trials."""
    one = build_tree(torch.tensor([parents], device=DEVICE), torch.tensor([len(parents)], device=DEVICE))
    return TreeMeta(*(_replicate(getattr(one, f.name)[0], n) for f in dataclasses.fields(TreeMeta)))


# ------------------------------------------------------------------------- first token
@ci_examples(6, gpu=40)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(8, 16), slots=st.integers(2, 12), dups=st.booleans())
def test_first_token_of_target_only_follows_the_target(seed, vocab, slots, dups):
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    parents = random_tree_parents(rng, slots)
    note(f"parents={parents} V={vocab} dups={dups}")
    tokens = [rng.randrange(vocab)] * slots
    for kids in children_lists(parents, slots):  # fixed drafts: distinct siblings unless `dups`
        pool = [rng.randrange(vocab) for _ in kids] if dups else rng.sample(range(vocab), len(kids))
        for c, t in zip(kids, pool):
            tokens[c] = t
    target = random_distributions(g, (slots, vocab), sparsity=0.25)
    for u, kids in enumerate(children_lists(parents, slots)):  # children often carry much mass
        target[u, [tokens[c] for c in kids]] += 0.3 * rng.random()
    target = target / target.sum(-1, keepdim=True)
    acc = verify_target_only(
        _replicate(torch.tensor(tokens), TRIALS),
        _tree(parents, TRIALS),
        _replicate(target, TRIALS),
        generator=torch.Generator(DEVICE).manual_seed(seed),
        impl=IMPL,
    )
    assert_follows(acc.accept_tokens[:, 0], _law(target[0]), "target-only first token")


def _sample_children(seed: int, parents: list[int], draft: torch.Tensor, n: int) -> torch.Tensor:
    """[n, N] tokens on DEVICE: each node's token drawn i.i.d. from its parent's draft row, per trial."""
    g = torch.Generator(DEVICE).manual_seed(seed + 101)  # a stream apart from the verifier's draws
    draft = draft.to(DEVICE)
    tokens = torch.zeros(n, len(parents), dtype=torch.int64, device=DEVICE)
    tokens[:, 0] = torch.randint(0, draft.shape[-1], (n,), generator=g, device=DEVICE)
    for i in range(1, len(parents)):
        tokens[:, i] = torch.multinomial(draft[parents[i]], n, replacement=True, generator=g)
    return tokens


@ci_examples(6, gpu=40)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(8, 16), slots=st.integers(2, 12))
def test_first_token_of_speculative_sampling_follows_the_target(seed, vocab, slots):
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    parents = random_tree_parents(rng, slots)
    note(f"parents={parents} V={vocab}")
    target = random_distributions(g, (slots, vocab), sparsity=0.25)
    mix = rng.random()  # the draft resembles the target to a random degree; q(x) = 0 where p(x) > 0 happens
    draft = mix * target + (1 - mix) * random_distributions(g, (slots, vocab), sparsity=0.5)
    tokens = _sample_children(seed, parents, draft, TRIALS)  # siblings i.i.d., duplicates included
    acc = verify_speculative(
        tokens,
        _tree(parents, TRIALS),
        _replicate(target, TRIALS),
        _replicate(draft, TRIALS),
        generator=torch.Generator(DEVICE).manual_seed(seed),
        impl=IMPL,
    )
    assert_follows(acc.accept_tokens[:, 0], _law(target[0]), "speculative first token")


# ------------------------------------------------------------ two tokens along a chain
def _complete_second_token(acc, cond: torch.Tensor, seed: int) -> torch.Tensor:
    """Second emitted token: from this step when a draft was accepted, else what the next
    step's first token would be, a direct draw from the target row cond[first token]."""
    first = acc.accept_tokens[:, 0]
    u = torch.rand(first.shape, generator=torch.Generator(DEVICE).manual_seed(seed + 202), device=DEVICE, dtype=torch.float64)
    fresh = sample_from_probs(cond.to(DEVICE)[first].double(), u)
    return torch.where(acc.accept_length >= 1, acc.accept_tokens[:, 1], fresh)


def _chain_law(p0: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    """Exact joint law of (t1, t2), flattened t1 * V + t2."""
    p1 = cond.double() / cond.double().sum(-1, keepdim=True)
    return (_law(p0)[:, None] * p1).flatten()


@pytest.mark.parametrize("verifier", ["target-only", "speculative"])
@ci_examples(4, gpu=20)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(6, 8))
def test_first_two_tokens_along_a_chain_follow_the_target_jointly(verifier, seed, vocab):
    """Chain root -> x1 -> x2; the target at x1 is the conditional row cond[x1]."""
    n = 2 * TRIALS
    g = torch.Generator().manual_seed(seed)
    p0 = random_distributions(g, (vocab,), 0.2)
    cond = random_distributions(g, (vocab, vocab), 0.2)  # target at node 1, given its token
    tail = random_distributions(g, (vocab, vocab), 0.2)  # target at node 2, given its token (third token)
    q0 = 0.5 * p0 + 0.5 * random_distributions(g, (vocab,), 0.3)
    q1 = 0.5 * cond + 0.5 * random_distributions(g, (vocab, vocab), 0.3)
    p0, cond, tail, q0, q1 = (t.to(DEVICE) for t in (p0, cond, tail, q0, q1))
    if verifier == "target-only":  # fixed drafts: the target's favourite tokens
        x1 = torch.full((n,), int(p0.argmax()), device=DEVICE)
        x2 = torch.full((n,), int(cond[int(p0.argmax())].argmax()), device=DEVICE)
    else:  # sampled drafts
        gd = torch.Generator(DEVICE).manual_seed(seed + 101)  # apart from the verifier's draws
        x1 = torch.multinomial(q0, n, replacement=True, generator=gd)
        x2 = torch.multinomial(q1[x1], 1, generator=gd)[:, 0]
    tokens = torch.stack([torch.zeros_like(x1), x1, x2], 1)
    target = torch.stack([p0.expand(n, vocab), cond[x1], tail[x2]], 1)
    tree = _tree([-1, 0, 1], n)
    gen = torch.Generator(DEVICE).manual_seed(seed)
    if verifier == "target-only":
        acc = verify_target_only(tokens, tree, target, generator=gen, impl=IMPL)
    else:
        draft = torch.stack([q0.expand(n, vocab), q1[x1], q1[x2]], 1)
        acc = verify_speculative(tokens, tree, target, draft, generator=gen, impl=IMPL)
    second = _complete_second_token(acc, cond, seed)
    pair = acc.accept_tokens[:, 0] * vocab + second
    assert_follows(pair, _chain_law(p0, cond), f"{verifier} joint of two tokens")
    if verifier == "speculative":  # acceptance rate of x1 = sum min(p, q), Hoeffding bound
        rate = float((acc.accept_length >= 1).double().mean())
        want = float(torch.minimum(_law(p0), _law(q0)).sum())
        assert abs(rate - want) <= math.sqrt(math.log(2 / DELTA) / (2 * n)) + EPS_NUM, (rate, want)


# ------------------------------------------------------------------ broken verifiers
def broken_target_only_first_token(tokens, p0, u) -> torch.Tensor:
    """Target-only at a star root WITHOUT removing rejected mass: accept child j iff
    u_j < p(x_j) (no renormalization), fall back to a draw from the unmasked p."""
    n, k = u.shape[0], tokens.numel()
    out = torch.full((n,), -1, dtype=torch.int64)
    for j in range(k):
        take = (out < 0) & (u[:, j] < p0[tokens[j]])
        out = torch.where(take, tokens[j], out)
    fresh = sample_from_probs(p0.double().expand(n, -1), u[:, k])
    return torch.where(out >= 0, out, fresh)


def broken_speculative_first_token(x, p0, q0, u) -> torch.Tensor:
    """Chain speculative sampling that recovers from p instead of norm(max(p - q, 0))."""
    accept = u[:, 0] * q0[x] < p0[x]
    fresh = sample_from_probs(p0.double().expand(x.shape[0], -1), u[:, 1])
    return torch.where(accept, x, fresh)


def test_a_verifier_that_skips_the_residual_renormalization_fails_the_test():
    g = torch.Generator().manual_seed(0)
    p0 = torch.tensor([0.30, 0.25, 0.05, 0.10, 0.10, 0.05, 0.10, 0.05])
    drafts = torch.tensor([0, 1, 3])  # the root's three children
    u = torch.rand(TRIALS, 4, generator=g, dtype=torch.float64)
    broken = broken_target_only_first_token(drafts, p0, u)
    with pytest.raises(AssertionError, match="TV="):
        assert_follows(broken, _law(p0), "broken target-only")
    # the real verifier on the same star passes
    tokens = torch.tensor([5, 0, 1, 3])
    acc = verify_target_only(
        _replicate(tokens, TRIALS), _tree([-1, 0, 0, 0], TRIALS), _replicate(p0.expand(4, 8), TRIALS),
        generator=torch.Generator(DEVICE).manual_seed(0), impl=IMPL,
    )
    assert_follows(acc.accept_tokens[:, 0], _law(p0), "target-only")


def test_a_verifier_that_recovers_from_p_instead_of_the_residual_fails_the_test():
    g = torch.Generator().manual_seed(1)
    p0 = torch.tensor([0.05, 0.40, 0.05, 0.20, 0.10, 0.10, 0.05, 0.05])
    q0 = torch.tensor([0.40, 0.05, 0.20, 0.05, 0.10, 0.10, 0.05, 0.05])
    x = torch.multinomial(q0, TRIALS, replacement=True, generator=g)
    u = torch.rand(TRIALS, 2, generator=g, dtype=torch.float64)
    with pytest.raises(AssertionError, match="TV="):
        assert_follows(broken_speculative_first_token(x, p0, q0, u), _law(p0), "broken speculative")
    tokens = torch.stack([torch.zeros_like(x), x], 1)
    acc = verify_speculative(
        tokens.to(DEVICE), _tree([-1, 0], TRIALS), _replicate(p0.expand(2, 8), TRIALS), _replicate(q0.expand(2, 8), TRIALS),
        generator=torch.Generator(DEVICE).manual_seed(1), impl=IMPL,
    )
    assert_follows(acc.accept_tokens[:, 0], _law(p0), "speculative")
