"""The conformance kit checks itself: for each property of verifiers, tree builders, KV
relocators, tree policies and drafters, a strategy with one realistic planted bug fails
exactly that property (and the kit's message names what broke), while the built-in it was
made from passes it (the built-ins' runs are in test_conformance_kit.py).

A property that a planted bug can pass promises less than its name says. Each planted bug
is a one-line change a plugin author could make: a path that skips a level, a bonus token
taken as the argmax, a bonus drawn at the wrong node, a depth off by one, a buffer OR-ed
instead of overwritten, one row relocated too many; a policy that skips its last expansion,
shifts a token, repeats a sibling, ranks with noise, expands the K worst, drops a static
path, or reports a node's children as drawn from its parent's distribution; a drafter that
caps num_nodes at the policy's drafts (forgetting the root), leaves the root token a
placeholder, or breaks ties between continuations with a coin. Planted elsewhere:
non-topological parents and one token too many (test_conformance_kit.py). Every property of
every kind has its planted bug (the last test checks the list).
"""

from __future__ import annotations

import pytest
import torch

from specdec import Acceptance
from specdec.ops import probs_for, sample_from_probs
from specdec.plugins.greedy import GreedyVerifier
from specdec.plugins.relocate import PagedRelocator
from specdec.plugins.target_only import TargetOnlyVerifier
from specdec.plugins.tree_builder import TreeBuilder
from specdec.registry import verifier_caps
from specdec.testing import Context, Subject, properties_for, run_property

CTX = Context(scale=0.4, shrink=False)


def _prop(subject: Subject, text: str):
    return next(p for p in properties_for(subject) if text in p.name)


def _verdict(obj, kind: str, text: str, caps=None):
    if kind == "verifier":
        caps = verifier_caps(obj)
    subject = Subject("planted", kind, obj=obj, caps=caps)
    return run_property(_prop(subject, text), subject, CTX)


# ----------------------------------------------------------------------------- verifiers
class SkipsALevel(GreedyVerifier):
    """Greedy, but a path of two or more drafts is reported without its first draft:
    [0, c1, c2, ...] becomes [0, c2, ...] (c2's parent is c1, not the root)."""

    def __call__(self, tokens, tree, target_logits, sampling=None, *, uniforms=None, draft_probs=None):
        acc = super().__call__(tokens, tree, target_logits, sampling, uniforms=uniforms, draft_probs=draft_probs)
        long = acc.accept_length >= 2  # [B]
        N = tokens.shape[1]
        skipped = torch.cat([acc.accept_nodes[:, :1], acc.accept_nodes[:, 2:], torch.full_like(acc.accept_nodes[:, :1], -1)], 1)
        nodes = torch.where(long[:, None], skipped[:, :N], acc.accept_nodes)
        out = torch.where(long[:, None], torch.cat([acc.accept_tokens[:, 1:], torch.full_like(acc.accept_tokens[:, :1], -1)], 1),
                          acc.accept_tokens)
        return Acceptance(accept_length=acc.accept_length - long.long(), accept_nodes=nodes, accept_tokens=out)


class ArgmaxBonus(TargetOnlyVerifier):
    """Target-only rejection sampling whose bonus token is the argmax instead of a draw."""

    def __call__(self, tokens, tree, target_logits, sampling=None, *, draft_probs=None, uniforms=None):
        acc = super().__call__(tokens, tree, target_logits, sampling, draft_probs=draft_probs, uniforms=uniforms)
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        last = acc.accept_nodes[rows, acc.accept_length]  # [B] the node the bonus is drawn at
        out = acc.accept_tokens.clone()
        out[rows, acc.accept_length] = target_logits[rows, last].argmax(-1)
        return Acceptance(accept_length=acc.accept_length, accept_nodes=acc.accept_nodes, accept_tokens=out)


class BonusAtTheParent(TargetOnlyVerifier):
    """Target-only, but after an accepted draft the bonus is drawn from the distribution at
    the accepted node's parent, not at the accepted node (the first token stays exact)."""

    def __call__(self, tokens, tree, target_logits, sampling=None, *, draft_probs=None, uniforms=None):
        acc = super().__call__(tokens, tree, target_logits, sampling, draft_probs=draft_probs, uniforms=uniforms)
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        a = acc.accept_length
        parent = acc.accept_nodes[rows, (a - 1).clamp(min=0)]  # [B]
        probs = probs_for(target_logits, sampling)[rows, parent].double()  # [B, V]
        redraw = sample_from_probs(probs, uniforms[rows, parent, 1])
        out = acc.accept_tokens.clone()
        out[rows, a] = torch.where(a >= 1, redraw, out[rows, a])
        return Acceptance(accept_length=a, accept_nodes=acc.accept_nodes, accept_tokens=out)


@pytest.mark.parametrize("planted, builtin, prop, message", [
    (SkipsALevel(), GreedyVerifier(), "acceptance is a path of the tree", r"is not a child of"),
    (ArgmaxBonus(), TargetOnlyVerifier(), "the first emitted token follows the target", r"first token"),
    (BonusAtTheParent(), TargetOnlyVerifier(), "the first two tokens along a chain", r"joint of two tokens"),
], ids=["skips-a-level", "argmax-bonus", "bonus-at-the-parent"])
def test_each_verifier_property_catches_its_planted_bug(planted, builtin, prop, message):
    import re

    bad = _verdict(planted, "verifier", prop)
    assert not bad.ok and re.search(message, bad.error), bad.error
    assert _verdict(builtin, "verifier", prop).ok


def test_the_planted_sampling_bugs_keep_the_properties_they_do_not_break():
    """Each distribution property tests its own thing: the parent-bonus bug leaves the first
    token exact, so only the joint property can catch it."""
    assert _verdict(BonusAtTheParent(), "verifier", "the first emitted token follows the target").ok


# ----------------------------------------------------------------------------- tree builders
class DepthOffByOne(TreeBuilder):
    """Positions of nodes at depth 2 and deeper one too large."""

    def __call__(self, parents, num_nodes, out=None):
        meta = super().__call__(parents, num_nodes, out=out)
        meta.positions.add_((meta.positions >= 2).long())
        return meta


class OrsIntoTheBuffer(TreeBuilder):
    """Ancestor bits OR-ed into a reused buffer instead of overwriting it (stale bits stay)."""

    def __call__(self, parents, num_nodes, out=None):
        if out is None:
            return super().__call__(parents, num_nodes)
        old = out.packed_mask.clone()
        super().__call__(parents, num_nodes, out=out)
        out.packed_mask.bitwise_or_(old)
        return out


@pytest.mark.parametrize("planted, prop, message", [
    (DepthOffByOne(), "tree metadata matches a plain parent walk", r"positions row"),
    (OrsIntoTheBuffer(), "a reused buffer keeps no stale bit", r"packed_mask row .*: wrong bits"),
], ids=["depth-off-by-one", "ors-into-the-buffer"])
def test_each_tree_builder_property_catches_its_planted_bug(planted, prop, message):
    import re

    bad = _verdict(planted, "tree-builder", prop)
    assert not bad.ok and re.search(message, bad.error), bad.error
    assert _verdict(TreeBuilder(), "tree-builder", prop).ok


def test_or_ing_into_a_fresh_buffer_passes_the_fresh_buffer_property():
    """The buffer bug only shows on reuse: the fresh-buffer property passes it, the reuse one does not."""
    assert _verdict(OrsIntoTheBuffer(), "tree-builder", "tree metadata matches a plain parent walk").ok


# ----------------------------------------------------------------------------- relocators
class OneRowTooMany(PagedRelocator):
    """Relocates accept_length + 1 drafts: the row after the accepted path moves too."""

    def __call__(self, cache, committed_len, accept_nodes, accept_length):
        more = torch.clamp(accept_length + 1, max=accept_nodes.shape[1] - 1)
        return super().__call__(cache, committed_len, accept_nodes, more)


def test_the_relocation_property_catches_one_row_too_many():
    depth = 11
    bad = _verdict(OneRowTooMany(max_path=depth + 1), "relocator", "accepted KV moves", caps=depth + 1)
    assert not bad.ok and "differs from the per-token loop" in bad.error, bad.error
    assert _verdict(PagedRelocator(max_path=depth + 1), "relocator", "accepted KV moves", caps=depth + 1).ok


def test_every_property_of_these_kinds_has_a_planted_bug_here():
    names = {p.name for kind in ("verifier", "tree-builder", "relocator")
             for p in properties_for(Subject("x", kind, obj=TargetOnlyVerifier(), caps=verifier_caps(TargetOnlyVerifier())))}
    planted = {"acceptance is a path of the tree", "the first emitted token follows the target",
               "the first two tokens along a chain", "tree metadata matches a plain parent walk",
               "a reused buffer keeps no stale bit", "accepted KV moves", "greedy rows accept exactly"}
    # the brute-force greedy walk's planted bug (one token too many) is in test_conformance_kit.py
    assert len(names) == 7 and all(any(p in name for p in planted) for name in names), sorted(names)


# ----------------------------------------------------------------------------- tree policies
from specdec.hookspecs import hookimpl  # noqa: E402
from specdec.policies import DynamicPolicy, SampledPolicy, group_sizes  # noqa: E402
from specdec.policies.shapes import StaticPolicy  # noqa: E402
from specdec.policies.static_tree import static_tree  # noqa: E402
from specdec.registry import get_plugin_manager  # noqa: E402
from specdec.testing import check  # noqa: E402

DYN = dict(topk=2, max_draft_len=3, max_total_draft_tokens=5)
CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


class SkipsTheLastCall(DynamicPolicy):
    """Declares D calls, makes D - 1: the last depth's candidates are copied from the call before."""

    def grow(self, expand, batch, device):
        seen = {}

        def lazy(frontier):
            if frontier.depth == self.depth - 1 and frontier.depth >= 2:
                return seen[frontier.depth - 1]
            seen[frontier.depth] = expand(frontier)
            return seen[frontier.depth]

        return super().grow(lazy, batch, device)


class ShiftedToken(DynamicPolicy):
    """Node 1's token moved by one: a token its parent never offered."""

    def grow(self, expand, batch, device):
        grown = super().grow(expand, batch, device)
        tokens = grown.tokens.clone()
        tokens[:, 0] = torch.where(grown.num_nodes > 0, tokens[:, 0] + 1, tokens[:, 0])
        return type(grown)(tokens, grown.parents, grown.num_nodes, grown.dist_index, grown.dists)


class DuplicateSiblings(DynamicPolicy):
    """When nodes 1 and 2 are both the root's children, node 2 repeats node 1's token."""

    def grow(self, expand, batch, device):
        grown = super().grow(expand, batch, device)
        tokens = grown.tokens.clone()
        both = (grown.parents[:, 0] == 0) & (grown.parents[:, 1] == 0) & (grown.num_nodes >= 2)
        tokens[:, 1] = torch.where(both, tokens[:, 0], tokens[:, 1])
        return type(grown)(tokens, grown.parents, grown.num_nodes, grown.dist_index, grown.dists)


class NoisyRanking(DynamicPolicy):
    """Ranks by score plus fresh noise (torch's global generator): two runs keep other nodes."""

    def _pick(self, t, score):
        return super()._pick(t, score + 3 * torch.rand(score.shape, device=score.device))

    def _select(self, scores):
        return super()._select(torch.where(scores > float("-inf"), scores + 3 * torch.rand(scores.shape), scores))


class KWorst(DynamicPolicy):
    """Expands the K worst candidates of each depth (keeps the best overall)."""

    def _pick(self, t, score):
        return super()._pick(t, torch.where(score > float("-inf"), -score, score))


class DropsAPath(StaticPolicy):
    """A static tree whose last path is kept as padding (its node never appears)."""

    def _select(self, scores):
        kept = super()._select(scores).clone()
        kept[:, -1] = kept[:, 0]  # a duplicate of the first kept node instead of the last path
        return kept


class ParentsRow(SampledPolicy):
    """Whole i.i.d. groups, but each expanded node's children are reported as drawn from its
    parent's distribution (`dist_index` one row too early): speculative sampling then tests
    them against the wrong `draft_probs`."""

    def grow(self, expand, batch, device):
        grown = super().grow(expand, batch, device)
        index = torch.where(grown.dist_index > 0, grown.dist_index - 1, grown.dist_index)
        return type(grown)(grown.tokens, grown.parents, grown.num_nodes, index, grown.dists)


class Planted:
    POLICIES = {
        "skips-last-call": lambda c: SkipsTheLastCall(c.shape.topk, c.shape.max_draft_len, c.shape.max_total_draft_tokens, name="skips-last-call"),
        "shifted-token": lambda c: ShiftedToken(c.shape.topk, c.shape.max_draft_len, c.shape.max_total_draft_tokens, name="shifted-token"),
        "duplicate-siblings": lambda c: DuplicateSiblings(c.shape.topk, c.shape.max_draft_len, c.shape.max_total_draft_tokens, name="duplicate-siblings"),
        "noisy-ranking": lambda c: NoisyRanking(c.shape.topk, c.shape.max_draft_len, c.shape.max_total_draft_tokens, name="noisy-ranking"),
        "k-worst": lambda c: KWorst(c.shape.topk, c.shape.max_draft_len, c.shape.max_total_draft_tokens, name="k-worst"),
        "drops-a-path": lambda c: DropsAPath(static_tree(CHOICES, budget=len(CHOICES), max_depth=3, source="test"), name="drops-a-path"),
        "parents-row": lambda c: ParentsRow(group_sizes(c.shape.max_total_draft_tokens, c.shape.max_draft_len, c.shape.topk), name="parents-row"),
        "sampled-copy": lambda c: SampledPolicy(group_sizes(c.shape.max_total_draft_tokens, c.shape.max_draft_len, c.shape.topk), name="sampled-copy"),
    }

    @hookimpl
    def specdec_strategy_names(self):
        return {"tree": list(self.POLICIES)}

    @hookimpl
    def specdec_tree_policy(self, config, verifier):
        make = self.POLICIES.get(config.tree)
        return None if make is None else make(config)


@pytest.mark.parametrize("name, prop, message", [
    ("skips-last-call", "expand is called D times", r"expand called 2 times; depth=3"),
    ("shifted-token", "every node is a candidate of its parent's expansion", r"is not a candidate of its parent"),
    ("duplicate-siblings", "greedy policies keep no two siblings", r"duplicate \(parent, token\)"),
    ("noisy-ranking", "the same candidates grow the same tree", r"differ between two identical runs"),
    ("k-worst", "dynamic keeps exactly the K best", r"frontier .* the K best are"),
    ("drops-a-path", "a static tree holds exactly its paths", r"tree paths .* choices|nodes, the tree has"),
], ids=lambda x: x if isinstance(x, str) and " " not in x else None)
def test_each_tree_policy_property_catches_its_planted_bug(name, prop, message):
    import re

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Planted())
    config = DYN if name != "drops-a-path" else dict(max_draft_len=3, max_total_draft_tokens=len(CHOICES))
    out = __import__("io").StringIO()
    results = check([name], pm=pm, config=config, scale=0.5, out=out, only=prop, shrink=False)
    assert [r.ok for r in results] == [False], out.getvalue()
    assert re.search(message, results[0].error), results[0].error


def test_the_sampling_property_catches_draft_probabilities_from_the_parents_row():
    """Only the distribution test reads `dist_index`; the same built-in, under the same config
    and examples, passes it. Four examples: the bug fails one alone for ~90% of table seeds."""
    import re

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Planted())
    prop = "with every lossless sampling verifier it allows, emitted tokens follow the target"
    verdicts = {}
    for name in ("parents-row", "sampled-copy"):
        out = __import__("io").StringIO()
        verdicts[name] = check([name], pm=pm, config=DYN, scale=2.0, out=out, only=prop, shrink=False)
    bad, good = verdicts["parents-row"], verdicts["sampled-copy"]
    assert [r.ok for r in bad] == [False] and [r.ok for r in good] == [True], (bad, good)
    assert re.search(r"verifier='speculative': first two tokens: TV=.* > tau=", bad[0].error), bad[0].error


# ----------------------------------------------------------------------------- drafters
from specdec.drafters.ngram_drafter import NgramDrafter, NgramIndex, NgramOptions  # noqa: E402


class CapsAtTheBudget(NgramDrafter):
    """num_nodes capped at the policy's S drafts instead of the S + 1 tree slots: a full tree
    loses its last node but keeps that node's parent in the padding."""

    def propose_host(self, accept_length, accept_tokens, root_tokens, active):
        tokens, parents, num_nodes = super().propose_host(accept_length, accept_tokens, root_tokens, active)
        return tokens, parents, num_nodes.clamp(max=self.policy.num_nodes)


class PlaceholderRoot(NgramDrafter):
    """Node 0 left as token 0, a placeholder for the root token the author thought the engine
    writes in: the target reads the wrong token at the root."""

    def propose_host(self, accept_length, accept_tokens, root_tokens, active):
        tokens, parents, num_nodes = super().propose_host(accept_length, accept_tokens, root_tokens, active)
        tokens[:, 0] = 0
        return tokens, parents, num_nodes


class _CoinIndex(NgramIndex):
    def children(self, occurrences):
        return sorted(super().children(occurrences), key=lambda c: (-c[1], float(torch.rand(()))))


class CoinTies(NgramDrafter):
    """Continuations of equal count ranked by a coin (torch's global generator) instead of the
    most recent occurrence first: two runs of the same requests draft other chains."""

    def prefill(self, slot, next_tokens, hidden=None, start=0):
        if start == 0 or self.slots[slot] is None:
            self.slots[slot] = _CoinIndex(self.options.min_match, self.options.max_match)
        self.slots[slot].extend(next_tokens.reshape(-1).tolist())


class PlantedDrafters:
    DRAFTERS = {"caps-at-the-budget": CapsAtTheBudget, "placeholder-root": PlaceholderRoot, "coin-ties": CoinTies}

    @hookimpl
    def specdec_strategy_names(self):
        return {"drafter": list(self.DRAFTERS)}

    @hookimpl
    def specdec_capture_layers(self, config, target):
        return () if config.drafter in self.DRAFTERS else None

    @hookimpl
    def specdec_draft(self, config, target, policy):
        make = self.DRAFTERS.get(config.drafter)
        return None if make is None else make(config, NgramOptions(), policy=policy)


def _drafter_verdicts(names, prop):
    """Twice the ci examples: with them the coins of every global seed tried (12) differ
    between the two runs; with fewer, one seed in four draws the same chains twice."""
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(PlantedDrafters())
    with torch.random.fork_rng():  # CoinTies' coins: the same draws every run of this test
        torch.manual_seed(0)
        return check(names, pm=pm, scale=2.0, out=__import__("io").StringIO(), only=prop, shrink=False)


@pytest.mark.parametrize("name, prop, message", [
    ("caps-at-the-budget", "every proposed tree has the declared shape", r"prompt \d+ failed: AssertionError: row \d+: padding parents are not -1"),
    ("placeholder-root", "greedy decoding with it equals target-only", r"tree='linear': \[\[.*\]\] != target-only"),
    ("coin-ties", "the same requests draft the same trees", r"proposal \d+ differs|\d+ vs \d+ proposals"),
], ids=["caps-at-the-budget", "placeholder-root", "coin-ties"])
@pytest.mark.filterwarnings("ignore:.*request\\(s\\) failed", "ignore:.*accepts almost nothing")
def test_each_drafter_property_catches_its_planted_bug(name, prop, message):
    import re

    results = _drafter_verdicts([name, "ngram"], prop)
    assert [(r.subject, r.ok) for r in results] == [(name, False), ("ngram", True)], [(r.subject, r.error) for r in results]
    assert re.search(message, results[0].error), results[0].error


@pytest.mark.filterwarnings("ignore:.*accepts almost nothing")
def test_a_drafter_that_breaks_the_contract_mid_run_still_decodes_exactly():
    """The capped num_nodes shows only once a tree is full, after the first proposals, and the
    engine turns it into a failed request, not a raise (the contract property now fails on the
    failed request; it used to pass); greedy decoding without the checker stays exact."""
    assert [r.ok for r in _drafter_verdicts(["caps-at-the-budget"], "greedy decoding with it equals target-only")] == [True]


def test_every_tree_policy_and_drafter_property_has_a_planted_bug():
    from specdec.testing import properties_for

    subjects = [Subject("dynamic", "tree-policy", obj=DynamicPolicy(2, 2, 3)),
                Subject("static", "tree-policy", obj=StaticPolicy(static_tree(CHOICES, budget=len(CHOICES), max_depth=3, source="test"))),
                Subject("ngram", "drafter")]
    names = {p.name for s in subjects for p in properties_for(s)}
    planted = {"expand is called D times", "every node is a candidate of its parent's expansion",
               "greedy policies keep no two siblings", "the same candidates grow the same tree", "dynamic keeps exactly the K best",
               "a static tree holds exactly its paths", "emitted tokens follow the target",
               "every proposed tree has the declared shape", "greedy decoding with it equals target-only",
               "the same requests draft the same trees",
               "every tree is topological"}  # the last: `Reversed` in test_conformance_kit.py
    assert len(names) == 11 and all(any(p in name for p in planted) for name in names), sorted(names)
