"""Properties of verifiers (`specdec_verify`), by capability:

- every verifier: its acceptance is a path of the tree that carries the node tokens, then
  one bonus token, then -1 (and, when lossless, the bonus has positive target probability);
- lossless verifiers: greedy rows accept exactly what a brute-force greedy walk accepts;
- lossless sampling verifiers: the emitted tokens follow the target distribution (first
  token on random trees; the first two tokens jointly along a chain), by a total-variation
  test whose threshold `oracles.tv_bound` fixes the false-alarm rate at 1e-6. Verifiers that
  need draft probabilities get children drawn i.i.d. from the draft rows; the others get
  children fixed before the draws (distinct, or with duplicates).
"""

from __future__ import annotations

import dataclasses
import random

import torch
from hypothesis import given, note
from hypothesis import strategies as st

from ..ops import build_tree, sample_from_probs, sampling_probs
from ..types import SamplingTensors, TreeMeta
from .kit import references_on_cpu, register
from .oracles import assert_follows, children_lists, depths, naive_greedy_walk
from .strategies import forests, logits_for, random_distributions, random_tree_parents, sampling_rows


def _lossless(subject) -> bool:
    return subject.caps.lossless


def _sampling(subject) -> bool:
    return subject.caps.lossless and not subject.caps.greedy_only


def _call(subject, tokens, tree, logits, sampling, uniforms, draft_probs=None):
    kw = dict(uniforms=None if subject.caps.greedy_only else uniforms)
    if subject.caps.needs_draft_probs:
        kw["draft_probs"] = draft_probs
    return subject.obj(tokens, tree, logits, sampling, **kw)


def _on(sampling: SamplingTensors, device) -> SamplingTensors:
    return SamplingTensors(*(None if t is None else t.to(device) for t in dataclasses.astuple(sampling)))


@register("verifier", "acceptance is a path of the tree carrying its tokens, then one bonus token", ci=25, gpu=300)
def acceptance_is_a_tree_path(subject, ctx):
    sizes = dict(max_batch=8, max_slots=256) if ctx.full else dict(max_batch=4, max_slots=70)

    @ctx.settings_for(acceptance_is_a_tree_path)
    @given(data=st.data())
    def check(data):
        forest = data.draw(forests(**sizes))
        vocab = data.draw(st.sampled_from([2, 3, 17, 64]))
        seed = data.draw(st.integers(0, 2**31 - 1))
        sampling = data.draw(sampling_rows(forest.batch, greedy=True if subject.caps.greedy_only else None))
        note(f"{forest!r} V={vocab} seed={seed} temperature={sampling.temperature.tolist()}")
        B, N, dev = forest.batch, forest.slots, ctx.device
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, min(vocab, 6), (B, N), generator=g)
        kids = [children_lists(forest.parents[b].tolist(), int(forest.num_nodes[b])) for b in range(B)]
        logits = logits_for(tokens, kids, vocab, seed)
        u = torch.rand(B, N, 2, generator=g, dtype=torch.float64)
        q = random_distributions(g, (B, N, vocab), 0.3)
        tree = build_tree(forest.parents.to(dev), forest.num_nodes.to(dev), impl="ref")
        acc = _call(subject, tokens.to(dev), tree, logits.to(dev), _on(sampling, dev), u.to(dev), q.to(dev))
        length, nodes, out = (t.cpu().tolist() for t in (acc.accept_length, acc.accept_nodes, acc.accept_tokens))
        probs = sampling_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p)
        for b in range(B):
            n, par, a = int(forest.num_nodes[b]), forest.parents[b].tolist(), length[b]
            deepest = max(depths(par, n))
            assert 0 <= a <= deepest, f"row {b}: accept_length={a}, the tree is {deepest} deep"
            assert nodes[b][0] == 0, f"row {b}: the path must start at the root, got {nodes[b][:a + 1]}"
            for j in range(1, a + 1):
                c = nodes[b][j]
                assert 0 < c < n and par[c] == nodes[b][j - 1], f"row {b}: node {c} is not a child of {nodes[b][j - 1]}"
                assert out[b][j - 1] == tokens[b, c], f"row {b}: accept_tokens[{j - 1}] is not node {c}'s token"
            assert 0 <= out[b][a] < vocab, f"row {b}: bonus token {out[b][a]} outside [0, {vocab})"
            assert nodes[b][a + 1 :] == [-1] * (N - a - 1) and out[b][a + 1 :] == [-1] * (N - a - 1), f"row {b}: -1 padding"
            if subject.caps.lossless:
                assert probs[b, nodes[b][a], out[b][a]] > 0, f"row {b}: bonus {out[b][a]} has target probability 0"

    check()


@register("verifier", "greedy rows accept exactly what a brute-force greedy walk accepts", ci=25, gpu=500, applies=_lossless)
def greedy_rows_match_the_brute_force_walk(subject, ctx):
    sizes = dict(max_batch=8, max_slots=256) if ctx.full else dict(max_batch=4, max_slots=70)

    @ctx.settings_for(greedy_rows_match_the_brute_force_walk)
    @given(data=st.data())
    def check(data):
        forest = data.draw(forests(**sizes))
        vocab = data.draw(st.sampled_from([2, 3, 17, 64, 130]))
        seed = data.draw(st.integers(0, 2**31 - 1))
        note(f"{forest!r} V={vocab} seed={seed}")
        B, N, dev = forest.batch, forest.slots, ctx.device
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, min(vocab, 6), (B, N), generator=g)
        kids = [children_lists(forest.parents[b].tolist(), int(forest.num_nodes[b])) for b in range(B)]
        logits = logits_for(tokens, kids, vocab, seed)
        greedy = SamplingTensors.from_params([_GREEDY] * B, device=dev)
        u = torch.rand(B, N, 2, generator=g, dtype=torch.float64)
        draft = torch.zeros(B, N, vocab).scatter_(2, logits.argmax(-1, keepdim=True), 1.0)  # any rows do for greedy
        tree = build_tree(forest.parents.to(dev), forest.num_nodes.to(dev), impl="ref")
        acc = _call(subject, tokens.to(dev), tree, logits.to(dev), greedy, u.to(dev), draft.to(dev))
        argmax = logits.argmax(-1).tolist()
        for b in range(B):
            path, emitted = naive_greedy_walk(forest.parents[b].tolist(), int(forest.num_nodes[b]), tokens[b].tolist(), argmax[b])
            a = len(path) - 1
            assert int(acc.accept_length[b]) == a, f"row {b}: accept_length {int(acc.accept_length[b])}, the greedy walk accepts {a}"
            assert acc.accept_nodes[b].tolist() == path + [-1] * (N - a - 1), f"row {b}: accept_nodes"
            assert acc.accept_tokens[b].tolist() == emitted + [-1] * (N - a - 1), f"row {b}: accept_tokens"

    check()


class _Greedy:
    temperature, top_k, top_p, min_p, seed = 0.0, 0, 1.0, 0.0, 0


_GREEDY = _Greedy()


def _replicate(x: torch.Tensor, n: int, device) -> torch.Tensor:
    return x.to(device).expand(n, *x.shape).contiguous()


def _tree(parents: list[int], n: int, device) -> TreeMeta:
    one = build_tree(torch.tensor([parents], device=device), torch.tensor([len(parents)], device=device), impl="ref")
    return TreeMeta(*(_replicate(getattr(one, f.name)[0], n, device) for f in dataclasses.fields(TreeMeta)))


def _temperature_one(n: int, device) -> SamplingTensors:
    return SamplingTensors(torch.ones(n, device=device), torch.zeros(n, dtype=torch.int64, device=device),
                           torch.ones(n, device=device), torch.zeros(n, device=device))


def _trials(ctx) -> int:
    return 2**20 if ctx.device.type == "cuda" else 2**16


@register("verifier", "the first emitted token follows the target distribution", ci=4, gpu=40, applies=_sampling)
def first_token_follows_the_target(subject, ctx):
    dev, n = ctx.device, _trials(ctx)

    @ctx.settings_for(first_token_follows_the_target)
    @given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(8, 16), slots=st.integers(2, 12), dups=st.booleans())
    def check(seed, vocab, slots, dups):
        rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
        parents = random_tree_parents(rng, slots)
        note(f"parents={parents} V={vocab} dups={dups}")
        target = random_distributions(g, (slots, vocab), sparsity=0.25)
        draft = None
        if subject.caps.needs_draft_probs:  # children i.i.d. from their parent's draft row, per trial
            mix = rng.random()
            draft = mix * target + (1 - mix) * random_distributions(g, (slots, vocab), sparsity=0.5)
            gd = torch.Generator(dev).manual_seed(seed + 101)
            tokens = torch.zeros(n, slots, dtype=torch.int64, device=dev)
            for i in range(1, slots):
                tokens[:, i] = torch.multinomial(draft[parents[i]].to(dev), n, replacement=True, generator=gd)
        else:  # fixed drafts: distinct siblings unless `dups`
            toks = [rng.randrange(vocab)] * slots
            for kids in children_lists(parents, slots):
                pool = [rng.randrange(vocab) for _ in kids] if dups else rng.sample(range(vocab), len(kids))
                for c, t in zip(kids, pool):
                    toks[c] = t
            for u, kids in enumerate(children_lists(parents, slots)):  # children often carry much mass
                target[u, [toks[c] for c in kids]] += 0.3 * rng.random()
            target = target / target.sum(-1, keepdim=True)
            tokens = _replicate(torch.tensor(toks), n, dev)
        u = torch.rand(n, slots, 2, generator=torch.Generator(dev).manual_seed(seed), device=dev, dtype=torch.float64)
        logits = _replicate(target.clamp_min(1e-30).log(), n, dev)  # temperature 1: probs = target
        acc = _call(subject, tokens, _tree(parents, n, dev), logits, _temperature_one(n, dev), u,
                    None if draft is None else _replicate(draft, n, dev))
        law = target[0].double() * (target[0] > 0)
        assert_follows(acc.accept_tokens[:, 0], law / law.sum(), f"verifier {subject.name!r} first token")

    with references_on_cpu(dev):
        check()


@register("verifier", "the first two tokens along a chain follow the target jointly", ci=2, gpu=20, applies=_sampling)
def two_tokens_follow_the_target(subject, ctx):
    dev, n = ctx.device, 2 * _trials(ctx)

    @ctx.settings_for(two_tokens_follow_the_target)
    @given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(6, 8))
    def check(seed, vocab):
        g = torch.Generator().manual_seed(seed)
        p0 = random_distributions(g, (vocab,), 0.2)
        cond, tail = random_distributions(g, (vocab, vocab), 0.2), random_distributions(g, (vocab, vocab), 0.2)
        q0 = 0.5 * p0 + 0.5 * random_distributions(g, (vocab,), 0.3)
        q1 = 0.5 * cond + 0.5 * random_distributions(g, (vocab, vocab), 0.3)
        p0, cond, tail, q0, q1 = (t.to(dev) for t in (p0, cond, tail, q0, q1))
        if subject.caps.needs_draft_probs:  # sampled drafts
            gd = torch.Generator(dev).manual_seed(seed + 101)
            x1 = torch.multinomial(q0, n, replacement=True, generator=gd)
            x2 = torch.multinomial(q1[x1], 1, generator=gd)[:, 0]
        else:  # fixed drafts: the target's favourite tokens
            x1 = torch.full((n,), int(p0.argmax()), device=dev)
            x2 = torch.full((n,), int(cond[int(p0.argmax())].argmax()), device=dev)
        tokens = torch.stack([torch.zeros_like(x1), x1, x2], 1)
        target = torch.stack([p0.expand(n, vocab), cond[x1], tail[x2]], 1)
        draft = torch.stack([q0.expand(n, vocab), q1[x1], q1[x2]], 1)
        u = torch.rand(n, 3, 2, generator=torch.Generator(dev).manual_seed(seed), device=dev, dtype=torch.float64)
        acc = _call(subject, tokens, _tree([-1, 0, 1], n, dev), target.clamp_min(1e-30).log(), _temperature_one(n, dev), u, draft)
        first = acc.accept_tokens[:, 0]
        fresh_u = torch.rand(n, generator=torch.Generator(dev).manual_seed(seed + 202), device=dev, dtype=torch.float64)
        fresh = sample_from_probs(cond[first].double(), fresh_u)  # what the next step's first token would be
        second = torch.where(acc.accept_length >= 1, acc.accept_tokens[:, 1], fresh)
        law = (p0.double()[:, None] * cond.double() / cond.double().sum(-1, keepdim=True)).flatten()
        assert_follows(first * vocab + second, law / law.sum(), f"verifier {subject.name!r} joint of two tokens")

    with references_on_cpu(dev):
        check()
