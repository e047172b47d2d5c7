"""Properties of tree policies (`specdec_tree_policy`), grown over a table "draft model"
(`oracles.PathTable`: the distribution at a node is a fixed random row keyed by the node's
path), for random shapes of the built-ins and the user's config for any other policy:

- every tree is topological and within the budget, padding is clean, depth <= D;
- `expand` is called D times with the declared frontier widths and candidate counts;
- every node is a candidate of its parent's expansion, one depth below its parent;
- greedy policies (samples=False) never keep two siblings with the same token;
- the same candidates grow the same tree (determinism);
- `dynamic` keeps exactly the K best path scores of each depth and the best `budget`
  overall (a brute-force EAGLE-2 on Python lists); static policies keep exactly their paths;
- with every installed lossless sampling verifier the policy allows, the emitted tokens
  follow the target distribution (the first two tokens jointly, TV test at delta = 1e-6).
"""

from __future__ import annotations

import torch
from hypothesis import given, note
from hypothesis import strategies as st

from ..config import ConfigError, SpecConfig
from ..ops import build_tree, sample_from_probs
from ..policies import DynamicPolicy, StaticPolicy
from ..registry import resolve_tree_policy, strategy_names, verifier_caps
from ..strategies import VerifierCaps
from ..types import SamplingTensors
from .kit import references_on_cpu, register
from .oracles import PathTable, assert_follows, naive_dynamic
from .strategies import choices

BRANCHING = {"dynamic", "sampled"}


@st.composite
def policy_configs(draw, subject, small: bool = False):
    """A SpecConfig for the subject's policy: random shapes for the built-ins, the user's
    config (fixed) for any other name."""
    name, base, options = subject.name, dict(subject.config), dict(subject.options)
    D_max = 3 if small else 4
    if name in BRANCHING:
        K, D = draw(st.integers(1, 3 if small else 4)), draw(st.integers(1, D_max))
        budget = draw(st.integers(D, D * K))
        return SpecConfig(tree=name, topk=K, max_draft_len=D, max_total_draft_tokens=budget, max_seq_len=256)
    if name == "linear":
        return SpecConfig(tree=name, max_draft_len=draw(st.integers(1, D_max + 2)), max_seq_len=256)
    if name == "static":
        paths = draw(st.one_of(st.none(), choices(max_nodes=8 if small else 14, max_depth=D_max)))
        if paths is None:  # the EAGLE-1 default, cut to a drawn budget and depth
            D = draw(st.integers(1, 5))
            return SpecConfig(tree=name, max_draft_len=D, max_total_draft_tokens=draw(st.integers(1, 25)), max_seq_len=256)
        return SpecConfig(tree=name, max_draft_len=max(len(p) for p in paths), max_total_draft_tokens=len(paths),
                          max_seq_len=256, plugin_options={"static": {"choices": paths}})
    return SpecConfig(**{"max_seq_len": 256, **base, "tree": name, "plugin_options": options})


def resolve(subject, config, needs_draft_probs: bool):
    """The policy for `config`, for a verifier needing draft probabilities or not; None when
    the policy cannot serve such a verifier (it keeps candidates by value)."""
    caps = VerifierCaps(lossless=True, needs_draft_probs=needs_draft_probs, greedy_only=False)
    try:
        return resolve_tree_policy(config, caps, subject.pm)
    except ConfigError:
        if needs_draft_probs:
            return None
        raise


def _grow(data, subject, ctx, *, integer=None):
    """Draw a config, a batch and a table; grow once. Returns (policy, grown, expand, table, B)."""
    config = data.draw(policy_configs(subject))
    needs = data.draw(st.booleans())
    policy = resolve(subject, config, needs) or resolve(subject, config, False)
    B = data.draw(st.integers(1, 4))
    V = data.draw(st.integers(max(2, max(policy.children)), 24))
    seed = data.draw(st.integers(0, 2**16))
    table = PathTable(V, seed, integer=data.draw(st.booleans()) if integer is None else integer)
    note(f"{policy!r} config={config} B={B} V={V} seed={seed}")
    expand = table.expander(torch.arange(B, device=ctx.device), sample=policy.samples,
                            generator=torch.Generator(ctx.device).manual_seed(seed))
    grown = policy.grow(expand, B, ctx.device)
    return policy, grown, expand, table, B


def _rows(grown, b):
    n = int(grown.num_nodes[b])
    return n, [-1] + grown.parents[b].tolist(), [0] + grown.tokens[b].tolist()


@register("tree-policy", "every tree is topological, within the budget, with clean padding", ci=25, gpu=300)
def trees_are_topological_and_within_budget(subject, ctx):
    @ctx.settings_for(trees_are_topological_and_within_budget)
    @given(data=st.data())
    def check(data):
        policy, grown, _, _, B = _grow(data, subject, ctx)
        S = policy.num_nodes
        for name in ("tokens", "parents"):
            t = getattr(grown, name)
            assert tuple(t.shape) == (B, S) and t.dtype == torch.int64, f"{name} is {tuple(t.shape)} {t.dtype}, want [{B}, {S}] int64"
        assert tuple(grown.num_nodes.shape) == (B,), f"num_nodes is {tuple(grown.num_nodes.shape)}, want [{B}]"
        for b in range(B):
            n, par, tok = _rows(grown, b)
            assert 0 <= n <= S, f"row {b}: num_nodes={n} outside [0, {S}]"
            depth = [0] * (n + 1)
            for i in range(1, n + 1):
                assert 0 <= par[i] < i, f"row {b}: node {i} has parent {par[i]} (not topological)"
                depth[i] = depth[par[i]] + 1
            assert max(depth) <= policy.depth, f"row {b}: depth {max(depth)} > D={policy.depth}"
            assert par[n + 1 :] == [-1] * (S - n) and tok[n + 1 :] == [0] * (S - n), f"row {b}: padding is not parent -1, token 0"

    check()


@register("tree-policy", "expand is called D times with the declared widths and candidate counts", ci=25, gpu=200)
def expand_follows_the_declared_shape(subject, ctx):
    @ctx.settings_for(expand_follows_the_declared_shape)
    @given(data=st.data())
    def check(data):
        policy, _, expand, _, B = _grow(data, subject, ctx)
        calls = expand.calls
        assert len(calls) == policy.depth, f"expand called {len(calls)} times; depth={policy.depth}"
        for t, call in enumerate(calls):
            assert call["depth"] == t, f"call {t} says depth={call['depth']}"
            assert call["width"] == policy.widths[t] and call["k"] == policy.children[t], (
                f"call {t}: {call['width']} nodes x {call['k']} candidates; declared {policy.widths[t]} x {policy.children[t]}"
            )

    check()


def _path_hashes(table, par, tok, n, root):
    h = [root] + [0] * n
    for i in range(1, n + 1):
        h[i] = table.child(h[par[i]], tok[i])
    return h


@register("tree-policy", "every node is a candidate of its parent's expansion, one depth below", ci=25, gpu=300)
def nodes_come_from_their_parents_expansion(subject, ctx):
    @ctx.settings_for(nodes_come_from_their_parents_expansion)
    @given(data=st.data())
    def check(data):
        policy, grown, expand, table, B = _grow(data, subject, ctx)
        for b in range(B):
            offered = {}  # (depth of the parent, parent hash) -> tokens offered with finite log-probability
            for t, call in enumerate(expand.calls):
                cand, hashes = call["cand"], call["hashes"][b].tolist()
                for f, h in enumerate(hashes):
                    ok = cand.logq[b, f] > float("-inf")
                    offered.setdefault((t, h), set()).update(cand.tokens[b, f][ok].tolist())
            n, par, tok = _rows(grown, b)
            h = _path_hashes(table, par, tok, n, b)
            depth = [0] * (n + 1)
            for i in range(1, n + 1):
                depth[i] = depth[par[i]] + 1
                key = (depth[par[i]], h[par[i]])
                assert key in offered, f"row {b}: node {i}'s parent {par[i]} was never expanded at depth {key[0]}"
                assert tok[i] in offered[key], f"row {b}: node {i} (token {tok[i]}) is not a candidate of its parent {par[i]}"

    check()


@register("tree-policy", "greedy policies keep no two siblings with the same token", ci=25, gpu=300)
def greedy_siblings_are_distinct(subject, ctx):
    @ctx.settings_for(greedy_siblings_are_distinct)
    @given(data=st.data())
    def check(data):
        policy, grown, _, _, B = _grow(data, subject, ctx)
        if policy.samples:
            return  # i.i.d. draws may repeat a token; that is what exact sampling needs
        for b in range(B):
            n, par, tok = _rows(grown, b)
            pairs = [(par[i], tok[i]) for i in range(1, n + 1)]
            assert len(set(pairs)) == len(pairs), f"row {b}: duplicate (parent, token) among {pairs}"

    check()


@register("tree-policy", "the same candidates grow the same tree", ci=10, gpu=100)
def growth_is_deterministic(subject, ctx):
    @ctx.settings_for(growth_is_deterministic)
    @given(data=st.data())
    def check(data):
        policy, grown, _, table, B = _grow(data, subject, ctx)
        seed = data.draw(st.integers(0, 2**16))
        runs = []
        for _ in range(2):
            expand = table.expander(torch.arange(B, device=ctx.device), sample=policy.samples,
                                    generator=torch.Generator(ctx.device).manual_seed(seed))
            runs.append(policy.grow(expand, B, ctx.device))
        for name in ("tokens", "parents", "num_nodes"):
            assert torch.equal(getattr(runs[0], name), getattr(runs[1], name)), f"{name} differ between two identical runs"

    check()


def _is_dynamic(subject) -> bool:
    return subject.name == "dynamic" or isinstance(subject.obj, DynamicPolicy)


@register("tree-policy", "dynamic keeps exactly the K best path scores of each depth (brute force)", ci=25, gpu=500, applies=_is_dynamic)
def dynamic_matches_the_brute_force(subject, ctx):
    @ctx.settings_for(dynamic_matches_the_brute_force)
    @given(data=st.data())
    def check(data):
        policy, grown, expand, table, B = _grow(data, subject, ctx)
        if not isinstance(policy, DynamicPolicy):
            return  # sampled drafts: `dynamic` grows whole i.i.d. groups instead
        K, D, S = policy.topk, policy.depth, policy.num_nodes
        for b in range(B):
            tokens, parents, frontiers = naive_dynamic(table, b, K, D, S)
            for t, call in enumerate(expand.calls):
                got = call["hashes"][b].tolist()
                assert got == frontiers[t], f"row {b}, depth {t}: frontier {got}, the K best are {frontiers[t]}"
            assert grown.tokens[b].tolist() == tokens and grown.parents[b].tolist() == parents, (
                f"row {b}: kept {list(zip(grown.parents[b].tolist(), grown.tokens[b].tolist()))}, "
                f"the best {S} are {list(zip(parents, tokens))}"
            )

    check()


def _is_static(subject) -> bool:
    return isinstance(subject.obj, StaticPolicy)


@register("tree-policy", "a static tree holds exactly its paths", ci=25, gpu=200, applies=_is_static)
def static_trees_hold_their_paths(subject, ctx):
    @ctx.settings_for(static_trees_hold_their_paths)
    @given(data=st.data())
    def check(data):
        policy, grown, expand, table, B = _grow(data, subject, ctx, integer=False)
        if not isinstance(policy, StaticPolicy):
            return
        for b in range(B):
            rank = {}  # (parent hash, token) -> candidate rank
            for call in expand.calls:
                for f, h in enumerate(call["hashes"][b].tolist()):
                    for j, x in enumerate(call["cand"].tokens[b, f].tolist()):
                        rank.setdefault((h, x), j)
            n, par, tok = _rows(grown, b)
            h = _path_hashes(table, par, tok, n, b)
            paths = [()] + [None] * n
            for i in range(1, n + 1):
                paths[i] = paths[par[i]] + (rank[(h[par[i]], tok[i])],)
            got = sorted(paths[1:], key=lambda p: (len(p), p))
            if not policy.samples:  # draws may repeat a token, which hides its rank
                assert got == list(policy.tree.paths), f"row {b}: tree paths {got}, choices {list(policy.tree.paths)}"
            assert n == len(policy.tree.paths), f"row {b}: {n} nodes, the tree has {len(policy.tree.paths)}"

    check()


# ----------------------------------------------------------------------------- with verifiers
def sampling_verifiers(pm) -> list[tuple[str, object, object]]:
    """(name, verifier, caps) of every installed lossless verifier that samples."""
    out = []
    for name in strategy_names(pm).get("verifier", []):
        try:
            verifier = pm.hook.specdec_verify(config=SpecConfig(verifier=name))
            caps = verifier_caps(verifier)
        except ConfigError:
            continue  # a verifier that needs options the kit cannot guess
        if caps.lossless and not caps.greedy_only:
            out.append((name, verifier, caps))
    return out


@register("tree-policy", "with every lossless sampling verifier it allows, emitted tokens follow the target", ci=2, gpu=10)
def tokens_follow_the_target_with_each_verifier(subject, ctx):
    dev = ctx.device
    n = 2**18 if dev.type == "cuda" else 2**15
    V = 6
    verifiers = sampling_verifiers(subject.pm)
    assert verifiers, "no lossless sampling verifier is installed"

    @ctx.settings_for(tokens_follow_the_target_with_each_verifier)
    @given(data=st.data())
    def check(data):
        config = data.draw(policy_configs(subject, small=True))
        seed = data.draw(st.integers(0, 2**16))
        draft, target = PathTable(V, seed, scale=1.0), PathTable(V, seed + 1, scale=1.0)
        tried = 0
        for name, verifier, caps in verifiers:
            policy = resolve(subject, config, caps.needs_draft_probs)
            if policy is None:
                continue  # the policy keeps candidates by value: it does not serve this verifier
            if max(policy.children) > V and not policy.samples:
                continue
            tried += 1
            note(f"verifier={name} {policy!r} seed={seed}")
            g = torch.Generator(dev).manual_seed(seed)
            expand = draft.expander(torch.zeros(n, dtype=torch.int64, device=dev), sample=policy.samples, generator=g)
            grown = policy.grow(expand, n, dev)
            S = grown.tokens.shape[1]
            tokens = torch.cat([torch.zeros(n, 1, dtype=torch.int64, device=dev), grown.tokens], 1)  # [n, N]
            parents = torch.cat([torch.full((n, 1), -1, dtype=torch.int64, device=dev), grown.parents], 1)
            hashes = torch.zeros(n, S + 1, dtype=torch.int64, device=dev)  # path hash of every node
            for i in range(1, S + 1):
                hashes[:, i] = target.child(hashes.gather(1, parents[:, i : i + 1].clamp(min=0))[:, 0], tokens[:, i])
            logits = target.logq(hashes)  # [n, N, V] log-probabilities: temperature 1 gives them back
            tree = build_tree(parents, grown.num_nodes + 1)
            u = torch.rand(n, S + 1, 2, generator=g, device=dev, dtype=torch.float64)
            sampling = SamplingTensors(torch.ones(n, device=dev), torch.zeros(n, dtype=torch.int64, device=dev),
                                       torch.ones(n, device=dev), torch.zeros(n, device=dev))
            kw = dict(uniforms=u)
            if caps.needs_draft_probs:
                index = torch.cat([torch.zeros(n, 1, dtype=torch.int64, device=dev), grown.dist_index], 1)
                rows = grown.dists.gather(1, index.clamp(min=0)[..., None].expand(-1, -1, V))
                kw["draft_probs"] = torch.where((index >= 0)[..., None], rows, 0.0)
            acc = verifier(tokens, tree, logits, sampling, **kw)
            first = acc.accept_tokens[:, 0]
            cond = target.logq(target.child(torch.zeros(V, dtype=torch.int64, device=dev), torch.arange(V, device=dev))).exp()  # [V, V]
            fresh = sample_from_probs(cond[first].double(), torch.rand(n, generator=g, device=dev, dtype=torch.float64))
            second = torch.where(acc.accept_length >= 1, acc.accept_tokens[:, 1], fresh)
            law = (target.logq(torch.zeros(1, dtype=torch.int64))[0].exp().double()[:, None] * cond.double().cpu()).flatten()  # [V * V]
            assert_follows(first * V + second, law / law.sum(), f"tree={subject.name!r} with verifier={name!r}: first two tokens")
        assert tried, "no installed lossless sampling verifier is allowed with this policy"

    with references_on_cpu(dev):
        check()
