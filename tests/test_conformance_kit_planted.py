"""The conformance kit checks itself: for each property of verifiers, tree builders and KV
relocators, a strategy with one realistic planted bug fails exactly that property (and the
kit's message names what broke), while the built-in strategy it was made from passes it.

A property that a planted bug can pass promises less than its name says. Each planted bug
is a one-line change a plugin author could make: a path that skips a level, a bonus token
taken as the argmax, a bonus drawn at the wrong node, a depth off by one, a buffer OR-ed
instead of overwritten, one row relocated too many. (The tree-policy properties have their
planted bugs in test_conformance_kit.py and test_tree_policies.py.)
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
