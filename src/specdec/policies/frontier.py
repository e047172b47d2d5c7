"""`FrontierPolicy`: the expand loop and node bookkeeping that every built-in tree policy
shares; a policy only says which candidates become the next frontier and which it keeps.

The loop (fixed shapes throughout, no host sync):

    call t = 0 .. D-1:  candidates = expand(frontier_t)          [B, F_t, K_t]
                        score = frontier score + log-probability  (path log-probability)
                        frontier_{t+1} = pick(t, score)           [B, F_{t+1}] (t < D-1)
    keep = select(every score)                                    [B, S]

Every candidate of every call enters one *history* (call-major, then frontier row, then
candidate), so a node's parent always has a lower history index. The kept nodes are laid
out in ascending history order (topological), nodes with score -inf ("no candidate", and
everything under one) move to the end as padding, and parents become tree indices.
Subclasses implement `_pick` and `_select`; third-party policies may subclass too.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..ops.columns import cat_columns
from ..types import Candidates, Frontier, GrownTree
from .candidates import clean_logq

__all__ = ["FrontierPolicy", "assemble"]


class FrontierPolicy:
    """Base class of the built-in policies (the `specdec.strategies.TreePolicy` protocol).

    Args:
        widths: (F_0 = 1, F_1, ..., F_{D-1}) frontier nodes expanded at each call.
        children: (K_0, ..., K_{D-1}) candidates asked of each frontier node.
        num_nodes: S, the draft slots of every tree (<= the history size).
        samples: candidates are i.i.d. draws (see `TreePolicy.samples`).
        name: for messages.
    """

    def __init__(self, widths: tuple[int, ...], children: tuple[int, ...], num_nodes: int, *, samples: bool, name: str):
        widths, children = tuple(int(w) for w in widths), tuple(int(k) for k in children)
        if not widths or widths[0] != 1 or len(widths) != len(children):
            raise ConfigError(f"tree={name!r}: widths {widths} must start with 1 (the root) and match children {children}")
        if min(widths) < 1 or min(children) < 1:
            raise ConfigError(f"tree={name!r}: widths {widths} and children {children} must be >= 1")
        for t in range(1, len(widths)):
            if widths[t] > widths[t - 1] * children[t - 1]:
                raise ConfigError(
                    f"tree={name!r}: call {t} expands {widths[t]} nodes, but call {t - 1} offers only "
                    f"{widths[t - 1]} x {children[t - 1]} candidates"
                )
        history = sum(w * k for w, k in zip(widths, children))
        if not 1 <= num_nodes <= history:
            raise ConfigError(f"tree={name!r}: num_nodes={num_nodes} is out of range; allowed: [1, {history}]")
        self.widths, self.children, self.num_nodes = widths, children, int(num_nodes)
        self.depth = len(widths)
        self.samples = bool(samples)
        self.name = name
        self.history_size = history
        # the loop's tensor glue, eager; `use_compiled` swaps in compiled copies
        self._score_call, self._next_frontier, self._finish = _score_call, _next_frontier, _finish
        self._consts_by_device: dict[torch.device, dict[str, torch.Tensor]] = {}

    # ------------------------------------------------------------------ subclass hooks
    def _pick(self, t: int, score: torch.Tensor) -> torch.Tensor:
        """Candidates of call t to expand at call t + 1: score [B, F_t * K_t] -> [B, F_{t+1}] int64."""
        raise NotImplementedError

    def _select(self, scores: torch.Tensor) -> torch.Tensor:
        """History indices to keep: scores [B, M] (every candidate's path score) -> [B, S] int64."""
        raise NotImplementedError

    def use_compiled(self, on: bool = True) -> None:
        """The loop's tensor glue (scores, next frontier, assembly) through torch.compile: a
        few fused kernels per call instead of ~15 launches. Subclasses with compiled hooks of
        their own extend this (and call it)."""
        from ..compile_scope import compile_private

        glue = dict(score_call=_score_call, next_frontier=_next_frontier, finish=_finish)
        for name, fn in glue.items():
            setattr(self, f"_{name}", compile_private(fn, dynamic=True, fullgraph=True) if on else fn)

    # ------------------------------------------------------------------ constants
    def prepare(self, device) -> None:
        """Make the loop's constant tensors on `device` now (a drafter calls this when it is
        built): a step then reads them as expanded views, no launch each, and a whole step
        compiled as one graph finds them already there (made inside its first trace, they
        changed the policy's state between two calls and forced a recompile)."""
        device = torch.device(device)
        for name, make in (("root_score", root_score), ("root_hist", root_hist), ("zero", zero_index)):
            self._const(name, device, make)
        M = self.history_size
        self._const(f"arange{M}", device, lambda d: torch.arange(M, device=d)[None])

    def _const(self, name: str, device: torch.device, make) -> torch.Tensor:
        """A constant tensor of this policy on `device`, made once by `make(device)` (by
        `prepare`, or at the first use: an eager run outside any captured graph, as
        `StaticPolicy`'s indices) and read as expanded views by every later step."""
        consts = self._consts_by_device.setdefault(device, {})
        if name not in consts:
            consts[name] = make(device)
        return consts[name]

    # ------------------------------------------------------------------ the loop
    def grow(self, expand, batch: int, device) -> GrownTree:
        B = batch
        device = torch.device(device)
        hist_tok, hist_score, hist_parent = [], [], []
        expanded = []  # (history index of the frontier nodes [B, F], first dist row)
        probs = []
        # the root's row, read-only: [B, 1] path score 0, history index -1, parent row 0
        fr_score = self._const("root_score", device, root_score).expand(B, 1)
        fr_hist = self._const("root_hist", device, root_hist).expand(B, 1)
        fr_tok, parent_slot = None, self._const("zero", device, zero_index).expand(B, 1)
        offset, rows = 0, 0
        for t in range(self.depth):
            F, K = self.widths[t], self.children[t]
            cand = expand(Frontier(depth=t, tokens=fr_tok, parent_slot=parent_slot, k=K))
            _check_candidates(cand, B, F, K, t, self.name)
            score, flat_tok, parent, nxt = self._call(t, fr_score, cand, fr_hist, offset)  # [B, F*K] each
            hist_tok.append(flat_tok)
            hist_score.append(score)
            hist_parent.append(parent)
            probs.append(cand.probs)
            if t > 0:
                expanded.append((fr_hist, rows))
            rows += F
            if nxt is not None:
                fr_tok, fr_score, fr_hist, parent_slot = nxt  # [B, F_{t+1}] each
            offset += F * K
        dists = dist_of = None
        if all(p is not None for p in probs):
            dists = torch.cat([p.float() for p in probs], 1)  # [B, E, Vd]
            dist_of = torch.full((B, offset), -1, dtype=torch.int64, device=device)  # history -> dist row
            for hist, first in expanded:
                dist_of.scatter_(1, hist, first + torch.arange(hist.shape[1], device=device).expand_as(hist))
        tokens, parents, num_nodes, dist_index = self._close(hist_score, hist_tok, hist_parent, dist_of)
        return GrownTree(tokens=tokens, parents=parents, num_nodes=num_nodes, dist_index=dist_index, dists=dists)

    def _call(self, t: int, fr_score, cand: Candidates, fr_hist, offset: int):
        """Call t's candidates into the history and, before the last call, the next frontier:
        (score, tokens, parents [B, F*K] each, (tokens, scores, history indices,
        parent rows) [B, F_{t+1}] each, or None after the last call)."""
        score, flat_tok, parent = self._score_call(fr_score, cand.logq, cand.tokens, fr_hist)
        if t + 1 == self.depth:
            return score, flat_tok, parent, None
        idx = self._pick(t, score)  # [B, F_{t+1}]
        return score, flat_tok, parent, self._next_frontier(flat_tok, score, idx, offset, self.children[t])

    def _close(self, hist_score: list, hist_tok: list, hist_parent: list, dist_of):
        """The kept nodes of the whole history as the tree (tokens, parents, num_nodes, dist_index):
        every call's scores [B, M], `_select`, then `_finish`. Policies whose selection needs no
        launch of its own fold the scores' concatenation into their `_finish` piece."""
        scores = torch.cat(hist_score, 1)  # [B, M]
        sel = self._select(scores)  # [B, S]
        return self._finish(sel, hist_tok, hist_parent, scores, dist_of)


def root_score(device) -> torch.Tensor:
    """[1, 1] float32 0: the root's path score."""
    return torch.zeros(1, 1, device=device)


def root_hist(device) -> torch.Tensor:
    """[1, 1] int64 -1: the root's history index."""
    return torch.full((1, 1), -1, dtype=torch.int64, device=device)


def zero_index(device) -> torch.Tensor:
    """[1, 1] int64 0: row / candidate 0."""
    return torch.zeros(1, 1, dtype=torch.int64, device=device)


def _score_call(fr_score: torch.Tensor, logq: torch.Tensor, tokens: torch.Tensor, fr_hist: torch.Tensor):
    """Call t's candidates into the history: fr_score [B, F], logq / tokens [B, F, K], fr_hist
    [B, F] -> path scores, tokens and parent history indices, each [B, F * K].

    `flatten`, not `reshape(B, F * K)` with F, K read off `tokens`: in a dynamic-shape graph
    the sum's sizes are logq's symbols, which Inductor cannot prove equal to tokens', so such a
    reshape wrote the scores twice (two kernels). The parents stay a copy: handed on as an
    expanded view and flattened inside `_finish`'s gathers, they saved a kernel per call on the
    GPU but broke torch 2.13's CPU Inductor (an indirect index's range lost: "vr must not be
    None for symbol indirect0")."""
    score = (fr_score[:, :, None] + clean_logq(logq.float())).flatten(1)
    parent = fr_hist[:, :, None].expand(tokens.shape).flatten(1)
    return score, tokens.flatten(1), parent


def _next_frontier(flat_tok: torch.Tensor, score: torch.Tensor, idx: torch.Tensor, offset: int, K: int):
    """The picked candidates idx [B, F'] of call t (history offset `offset`, K per node) ->
    the next frontier's tokens, scores, history indices and parent rows, each [B, F']."""
    return torch.gather(flat_tok, 1, idx), torch.gather(score, 1, idx), offset + idx, idx // K


def _finish(sel, hist_tok: list, hist_parent: list, scores, dist_of):
    """`assemble` over the per-call history pieces, as a tuple (tokens, parents, num_nodes,
    dist_index): a compiled piece returns tensors, not a `GrownTree`. `scores`: [B, M], or the
    calls' pieces (concatenated here, in this piece's kernels)."""
    if isinstance(scores, (list, tuple)):
        scores = cat_columns(scores)
    tree = assemble(sel, cat_columns(hist_tok), cat_columns(hist_parent), scores, dist_of)
    return tree.tokens, tree.parents, tree.num_nodes, tree.dist_index


def _check_candidates(cand: Candidates, B: int, F: int, K: int, t: int, name: str) -> None:
    want = (B, F, K)
    if tuple(cand.tokens.shape) != want or tuple(cand.logq.shape) != want:
        raise ValueError(
            f"tree={name!r}, call {t}: expand returned tokens {tuple(cand.tokens.shape)} and logq "
            f"{tuple(cand.logq.shape)}; the policy asked for [{B}, {F}, {K}]"
        )
    if cand.probs is not None and tuple(cand.probs.shape[:2]) != (B, F):
        raise ValueError(f"tree={name!r}, call {t}: probs {tuple(cand.probs.shape)} must be [{B}, {F}, Vd]")


def assemble(sel, hist_tok, hist_parent, scores, dist_of=None, dists=None) -> GrownTree:
    """Kept history indices -> a `GrownTree` (see the module docstring).

    Args:
        sel: [B, S] int64 distinct history indices to keep (any order, ancestor-closed
            among the nodes of finite score).
        hist_tok, hist_parent, scores: [B, M] every candidate's token, parent history index
            (-1 = the root) and path score.
        dist_of: [B, M] int64 dist row of each expanded history node (-1 = none) or None.
        dists: [B, E, Vd] or None.
    """
    B, S = sel.shape
    M = hist_tok.shape[1]
    valid = torch.gather(scores, 1, sel) > float("-inf")  # [B, S]
    key = torch.where(valid, sel, sel + M).sort(dim=-1).values  # valid first, each in history order
    sel, valid = key % M, key < M
    tokens = torch.where(valid, torch.gather(hist_tok, 1, sel), 0)
    inv = torch.full_like(hist_tok, -1)  # [B, M] history index -> tree index
    inv.scatter_(1, sel, torch.arange(1, S + 1, device=sel.device).expand(B, S))
    ph = torch.gather(hist_parent, 1, sel)  # [B, S], -1 = child of the root
    parents = torch.where(ph < 0, 0, torch.gather(inv, 1, ph.clamp(min=0)))
    parents = torch.where(valid, parents, -1)
    dist_index = None
    if dist_of is not None:
        dist_index = torch.where(valid, torch.gather(dist_of, 1, sel), -1)
    return GrownTree(tokens=tokens, parents=parents, num_nodes=valid.sum(-1), dist_index=dist_index, dists=dists)
