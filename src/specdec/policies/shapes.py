"""The built-in tree policies: `linear`, `dynamic` (EAGLE-2), `sampled` (whole i.i.d. groups)
and `static` (a fixed tree of "choices" paths, EAGLE-1 / Medusa format).

Each is a `FrontierPolicy` that only says which candidates become the next frontier
(`_pick`) and which the tree keeps (`_select`); `from_config` turns a `SpecConfig` into one,
with the capacity rules that used to live in `SpecConfig` (they depend on the policy).

- linear: a chain, top-1 per depth (or one i.i.d. draw per depth when sampling).
- dynamic: EAGLE-2. Call 0: top-K children of the root; each later call expands the top-K
  children of each of the K frontier nodes (K*K candidates scored by path log-probability)
  and keeps the best K as the next frontier; after D calls a global rerank keeps the best
  `budget` nodes of the whole history. Ties anywhere -> the lower history index (a child's
  score never exceeds its parent's, so the kept set is ancestor-closed).
- sampled: each depth draws a group of c_t i.i.d. children of one node and keeps the group
  whole; the next node expanded is the best draw of the group (by path log-probability).
  Group sizes: `budget` split over D groups of 1..K draws, larger groups first.
- static: the tree of `choices` (see `specdec.policies.static_tree`).

With a verifier that needs draft probabilities (standard speculative sampling), `linear`
draws a sampled chain and `dynamic` grows the `sampled` tree (EAGLE-2's value-based pruning
would bias the drafts), as before policies were pluggable; `static` draws i.i.d. children
into its fixed shape.
"""

from __future__ import annotations

import torch

from ..compile_scope import compile_private
from ..config import ConfigError, SpecConfig
from ..kernels.ranked_call import MAX_ROW, MAX_WIDTH, ranked_call_triton
from ..ops.columns import cat_columns
from ..ops.dispatch import use_triton
from .candidates import stable_topk
from .frontier import FrontierPolicy, _finish, _next_frontier, _score_call, zero_index
from .static_tree import StaticTree, read_choices, static_tree

__all__ = ["LinearPolicy", "DynamicPolicy", "SampledPolicy", "StaticPolicy", "group_sizes", "history_size", "builtin", "BUILTIN"]


def history_size(topk: int, depth: int) -> int:
    """Candidates an EAGLE-2 draft scores: K + K*K*(D-1)."""
    return topk + topk * topk * (depth - 1)


def group_sizes(budget: int, depth: int, topk: int) -> tuple[int, ...]:
    """Children drawn at each depth of a sampled tree: `budget` split over `depth` groups of
    1..topk draws, as evenly as possible, larger groups first."""
    if not depth <= budget <= depth * topk:
        raise ConfigError(f"max_total_draft_tokens={budget} is out of range; allowed: [{depth}, {depth * topk}] (depth x topk)")
    base, extra = divmod(budget, depth)
    return tuple(base + (1 if t < extra else 0) for t in range(depth))


def _best(score: torch.Tensor, k: int) -> torch.Tensor:
    return stable_topk(score, k)


def _chain_finish(sel, hist_tok: list, hist_parent: list, scores, dist_of):
    """`frontier.assemble` of a chain, every node kept (as `_finish`: tokens, parents, num_nodes,
    dist_index). Node t's parent is node t - 1 (tree index t); the valid nodes (finite path
    score) are a prefix, since a path score that is -inf or NaN stays so down the chain, so no
    sort is needed: each field is the history itself, cut where the scores stop being valid.
    `scores`: [B, D], or the calls' D columns [B, 1] (`LinearPolicy._close`: concatenated here,
    in this piece's kernel, not by a launch of their own)."""
    tokens = cat_columns(hist_tok)  # [B, D]
    if isinstance(scores, (list, tuple)):
        scores = cat_columns(scores)
    valid = scores > float("-inf")  # [B, D]; NaN is not valid
    depth = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    dist_index = None if dist_of is None else torch.where(valid, dist_of, -1)
    return torch.where(valid, tokens, 0), torch.where(valid, depth, -1), valid.sum(-1), dist_index


def _history_index(t: int):
    """The maker of the [1, 1] int64 constant t (`FrontierPolicy._const`): a chain's node t's history index."""
    return lambda device: torch.full((1, 1), t, dtype=torch.int64, device=device)


def _every(policy: FrontierPolicy, scores: torch.Tensor) -> torch.Tensor:
    """Keep every history node, in order: [B, M] int64 (a constant view: no launch per step)."""
    return _every_of(policy, scores.shape[0], scores.shape[1], scores.device)


def _every_of(policy: FrontierPolicy, B: int, M: int, device) -> torch.Tensor:
    """`_every` of a [B, M] history."""
    arange = policy._const(f"arange{M}", device, lambda d: torch.arange(M, device=d)[None])
    return arange.expand(B, M)


def _ranked_close(hist_score: list, hist_tok: list, hist_parent: list, S: int):
    """`FrontierPolicy._close` of a policy that keeps the S best-scored nodes, as one piece: the
    scores' concatenation, their ranking and the assembly (apart: an eager `torch.cat`, `_best`
    and `_finish`)."""
    scores = cat_columns(hist_score)  # [B, M]
    return _finish(_best(scores, S), hist_tok, hist_parent, scores, None)


def _ranked_call(fr_score, logq, tokens, fr_hist, width: int, offset: int, K: int, impl: str = "auto"):
    """`FrontierPolicy._call` of a ranked policy before its last call, as one piece: the scores,
    their ranking and the next frontier's gathers (`_score_call`, `_best`, `_next_frontier`:
    apart, four pieces and five GPU kernels a call). On CUDA (`impl`, `ops.dispatch`) one Triton
    kernel, `kernels.ranked_call` (compiled from PyTorch: 3-4 kernels and a sort); this PyTorch
    body is its reference."""
    if _ranked_kernel_takes(impl, logq, width):
        return ranked_call_triton(fr_score.contiguous(), logq.contiguous(), tokens.contiguous(), fr_hist.contiguous(),
                                  width, offset)
    score, flat_tok, parent = _score_call(fr_score, logq, tokens, fr_hist)
    idx = _best(score, width)  # [B, width]
    return (score, flat_tok, parent) + _next_frontier(flat_tok, score, idx, offset, K)


def _ranked_kernel_takes(impl: str, logq: torch.Tensor, width: int) -> bool:
    """Whether `kernels.ranked_call` runs this call: CUDA, or Triton's interpreter outside
    torch.compile (a compiled CPU graph takes the PyTorch body), within the kernel's sizes."""
    fits = width <= MAX_WIDTH and logq.shape[1] * logq.shape[2] <= MAX_ROW
    if impl == "triton" and not fits:
        raise ValueError(f"_ranked_call(impl='triton'): width={width} must be at most {MAX_WIDTH} and F * K = "
                         f"{logq.shape[1] * logq.shape[2]} at most {MAX_ROW}; use impl='auto' or 'ref'")
    return fits and use_triton(impl, logq) and (logq.is_cuda or not torch.compiler.is_compiling())


class _Ranked(FrontierPolicy):
    """Policies whose next frontier is the best-scored candidates of a call (`widths[t + 1]` of
    them); the scoring, ranking and gathers of a call run as one compiled piece (`_ranked_call`)
    unless a subclass picks otherwise (overrides `_pick`)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._rank, self._ranked_call = _best, _ranked_call

    def use_compiled(self, on: bool = True) -> None:
        super().use_compiled(on)
        self._rank = compile_private(_best, dynamic=True, fullgraph=True) if on else _best
        self._ranked_call = compile_private(_ranked_call, dynamic=True, fullgraph=True) if on else _ranked_call

    def _pick(self, t, score):
        return self._rank(score, self.widths[t + 1])

    def _call(self, t, fr_score, cand, fr_hist, offset):
        if t + 1 == self.depth or type(self)._pick is not _Ranked._pick:
            return super()._call(t, fr_score, cand, fr_hist, offset)
        score, flat_tok, parent, *nxt = self._ranked_call(fr_score, cand.logq, cand.tokens, fr_hist, self.widths[t + 1],
                                                          offset, self.children[t])
        return score, flat_tok, parent, tuple(nxt)


class LinearPolicy(FrontierPolicy):
    """A chain of `depth` drafts: the single candidate of each call is the next frontier.

    Its glue knows the shape: the next frontier is the call's one candidate as it is (views and
    constants, no kernel: the generic gathers were 4 GPU kernels per call), and the tree is the
    history in order, cut where the path score stops being finite (`_chain_finish`: one or two
    kernels where the generic `assemble` ran ~15)."""

    def __init__(self, depth: int, *, samples: bool = False, name: str = "linear") -> None:
        super().__init__((1,) * depth, (1,) * depth, depth, samples=samples, name=name)
        self._next_frontier, self._finish = self._chain_next, _chain_finish

    def use_compiled(self, on: bool = True) -> None:
        super().use_compiled(on)
        self._next_frontier = self._chain_next  # views only: nothing to compile
        self._finish = compile_private(_chain_finish, dynamic=True, fullgraph=True) if on else _chain_finish

    def prepare(self, device) -> None:
        super().prepare(device)
        for t in range(self.depth):
            self._const(f"hist{t}", torch.device(device), _history_index(t))

    def _pick(self, t, score):  # the call's one candidate (a constant view: no launch)
        return self._const("zero", score.device, zero_index).expand(score.shape[0], 1)

    def _chain_next(self, flat_tok, score, idx, offset: int, K: int):
        """`_next_frontier` of a chain (F = K = 1, idx = 0): the candidate's token and score
        [B, 1] as they are, its history index `offset` and parent row 0 as constant views."""
        B = flat_tok.shape[0]
        hist = self._const(f"hist{offset}", flat_tok.device, _history_index(offset))
        return flat_tok, score, hist.expand(B, 1), idx

    def _select(self, scores):
        return _every(self, scores)

    def _close(self, hist_score, hist_tok, hist_parent, dist_of):
        if type(self)._select is not LinearPolicy._select:
            return super()._close(hist_score, hist_tok, hist_parent, dist_of)
        # every node kept (a constant view): the score columns go to `_finish` as they are
        sel = _every_of(self, hist_score[0].shape[0], self.history_size, hist_score[0].device)
        return self._finish(sel, hist_tok, hist_parent, hist_score, dist_of)

    def __repr__(self) -> str:
        return f"LinearPolicy(depth={self.depth}, samples={self.samples})"


class DynamicPolicy(_Ranked):
    """EAGLE-2 (module docstring): K children per node, K frontier nodes, `budget` kept."""

    def __init__(self, topk: int, depth: int, budget: int, *, name: str = "dynamic") -> None:
        if not 1 <= budget <= history_size(topk, depth):
            raise ConfigError(
                f"max_total_draft_tokens={budget} is out of range; allowed: [1, {history_size(topk, depth)}] "
                f"for topk={topk}, depth={depth}"
            )
        super().__init__((1,) + (topk,) * (depth - 1), (topk,) * depth, budget, samples=False, name=name)
        self.topk = topk
        self._ranked_close = _ranked_close

    def _select(self, scores):
        return self._rank(scores, self.num_nodes)

    def use_compiled(self, on: bool = True) -> None:
        super().use_compiled(on)
        self._ranked_close = compile_private(_ranked_close, dynamic=True, fullgraph=True) if on else _ranked_close

    def _close(self, hist_score, hist_tok, hist_parent, dist_of):
        if dist_of is not None or type(self)._select is not DynamicPolicy._select:
            return super()._close(hist_score, hist_tok, hist_parent, dist_of)
        return self._ranked_close(hist_score, hist_tok, hist_parent, self.num_nodes)

    def __repr__(self) -> str:
        return f"DynamicPolicy(topk={self.topk}, depth={self.depth}, budget={self.num_nodes})"


class SampledPolicy(_Ranked):
    """Whole i.i.d. groups of `sizes[t]` draws; the best draw of a group is expanded next."""

    def __init__(self, sizes: tuple[int, ...], *, name: str = "sampled") -> None:
        super().__init__((1,) * len(sizes), tuple(sizes), sum(sizes), samples=True, name=name)
        self.sizes = tuple(sizes)

    def _select(self, scores):
        return _every(self, scores)

    def __repr__(self) -> str:
        return f"SampledPolicy(sizes={self.sizes})"


class StaticPolicy(FrontierPolicy):
    """A fixed tree (`StaticTree`): frontier and kept nodes are constant indices."""

    def __init__(self, tree: StaticTree, *, samples: bool = False, name: str = "static") -> None:
        super().__init__(tree.widths, tree.children, len(tree.paths), samples=samples, name=name)
        self.tree = tree

    def _pick_index(self, t: int, device) -> torch.Tensor:
        """[1, F_{t+1}] int64: the candidates of call t the fixed tree expands next (a constant)."""
        return self._const(f"pick{t}", device, lambda d: torch.tensor(self.tree.picks[t], dtype=torch.int64, device=d)[None])

    def _kept_index(self, device) -> torch.Tensor:
        """[1, S] int64: the history indices the fixed tree keeps (a constant)."""
        return self._const("kept", device, lambda d: torch.tensor(self.tree.kept, dtype=torch.int64, device=d)[None])

    def prepare(self, device) -> None:
        super().prepare(device)
        device = torch.device(device)
        for t in range(len(self.tree.picks)):
            self._pick_index(t, device)
        self._kept_index(device)

    def _pick(self, t, score):
        return self._pick_index(t, score.device).expand(score.shape[0], -1)

    def _select(self, scores):
        return self._kept_index(scores.device).expand(scores.shape[0], -1)

    def __repr__(self) -> str:
        return f"StaticPolicy({len(self.tree.paths)} paths, depth={self.depth}, samples={self.samples})"


# ------------------------------------------------------------------ from a SpecConfig
def _no_topk(config: SpecConfig, name: str, why: str) -> None:
    if config.shape.topk is not None:
        # An error, not a warning: a silently ignored knob hides a misconfigured benchmark.
        raise ConfigError(
            f"topk={config.shape.topk} does not apply to tree={name!r} ({why}); leave topk=None, or use a tree that "
            "branches by topk ('dynamic', 'sampled')"
        )


def _budget_range(config: SpecConfig, lo: int, hi: int) -> None:
    total = config.shape.max_total_draft_tokens
    if not lo <= total <= hi:
        raise ConfigError(f"max_total_draft_tokens={total} is out of range; allowed: [{lo}, {hi}]")


def linear(config: SpecConfig, *, samples: bool, name: str = "linear") -> FrontierPolicy:
    _no_topk(config, name, "one chain of max_draft_len drafts")
    D = config.shape.max_draft_len
    _budget_range(config, D, D)
    return LinearPolicy(D, samples=samples, name=name)


def dynamic(config: SpecConfig, *, samples: bool, name: str = "dynamic") -> FrontierPolicy:
    if config.shape.topk is None:
        raise ConfigError(f"tree={name!r} needs topk >= 1 (children per expanded node; --topk on the command "
                          "line), got None; EAGLE-2 uses topk=8")
    D, K = config.shape.max_draft_len, config.shape.topk
    _budget_range(config, D, D * K)
    if samples:  # exactness needs whole i.i.d. groups, not EAGLE-2's value-based pruning
        return SampledPolicy(group_sizes(config.shape.max_total_draft_tokens, D, K), name=name)
    return DynamicPolicy(K, D, config.shape.max_total_draft_tokens, name=name)


def sampled(config: SpecConfig, *, samples: bool = True, name: str = "sampled") -> FrontierPolicy:
    D, K = config.shape.max_draft_len, config.shape.topk or 1
    _budget_range(config, D, D * K)
    return SampledPolicy(group_sizes(config.shape.max_total_draft_tokens, D, K), name=name)


def static(config: SpecConfig, *, samples: bool, choices=None, name: str = "static", source: str | None = None) -> FrontierPolicy:
    """`choices` None = the EAGLE-1 default tree cut to the config's budget and depth."""
    _no_topk(config, name, "a static tree takes its widths from its paths")
    tree = static_tree(
        choices, budget=config.shape.max_total_draft_tokens, max_depth=config.shape.max_draft_len,
        source=source or f"plugin_options[{name!r}]['choices']",
    )
    return StaticPolicy(tree, samples=samples, name=name)


BUILTIN = {"linear": linear, "dynamic": dynamic, "static": static, "sampled": sampled}


def builtin(config: SpecConfig, *, samples: bool) -> FrontierPolicy:
    """The built-in policy `config.tree` names, with candidates sampled iff `samples` (or
    always, for `sampled`); static choices come from ``plugin_options["static"]`` (``"choices"`` or ``"file"``)."""
    from ..plugins.options import plugin_options

    make = BUILTIN.get(config.tree)
    if make is None:
        raise ConfigError(f"tree={config.tree!r} is not a built-in policy; built-ins: {sorted(BUILTIN)}")
    if make is static:
        return static(config, samples=samples, **_static_choices(plugin_options(config, "static", {"choices", "file"})))
    return make(config, samples=samples)


def _static_choices(options: dict) -> dict:
    """`static`'s choices and where they came from: ``"choices"`` inline, or ``"file"``, a JSON
    file of paths (`read_choices`); neither = the EAGLE-1 default."""
    if "choices" in options and "file" in options:
        raise ConfigError("plugin_options['static'] takes 'choices' or 'file', not both")
    if "file" in options:
        return dict(choices=read_choices(options["file"]), source=f"tree choices file {options['file']}")
    return dict(choices=options.get("choices"))
