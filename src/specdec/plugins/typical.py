"""verifier="typical": Medusa-style typical acceptance, an opt-in LOSSY verifier.

Rule. Let p be the distribution the request samples from at a node (`sampling_probs`:
temperature, then top-k, top-p, min-p) and H(p) its entropy in nats. A child with token x
is *acceptable* iff

    p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p))).

The walk starts at the root; at each node it takes the *first* acceptable child in sibling
order (index order: the drafters put their best candidate first) and stops at a node with
none, or after `max_draft_len` nodes. (Medusa instead picks, among the longest acceptable
paths, the one of highest likelihood; first-acceptable keeps the walk O(depth) and works on
any tree shape, dynamic trees included.) The bonus token is drawn from p at the last
accepted node with ``uniforms[b, node, 1]`` (the shared draw rule of
`specdec.ops.sample_from_probs`): argmax for greedy rows, a sample otherwise.

Greedy rows (temperature 0): p is one-hot at the argmax, so a child is acceptable iff it is
the argmax and the output equals target greedy decoding. Sampled rows do NOT follow the
target distribution (hence ``lossless = False``, which `SpecDecoder` reports in its stats).
Works with every drafter (no draft probabilities needed).

Options, in ``SpecConfig.plugin_options["typical"]``: ``posterior_threshold`` in (0, 1]
(default 0.09) and ``posterior_alpha`` in [0, 1] (default 0.3, Medusa's defaults).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.config import ConfigError, SpecConfig
from specdec.plugin_helpers import declared_names, strategy_hook
from specdec.ops import probs_for, sample_from_probs
from specdec.types import Acceptance, TreeMeta

NAME = "typical"


@dataclass(frozen=True)
class TypicalOptions:
    """Thresholds of typical acceptance (see the module docstring)."""

    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3

    def __post_init__(self) -> None:
        for name, lo, lo_open in (("posterior_threshold", 0.0, True), ("posterior_alpha", 0.0, False)):
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            ok = ok and (v > lo if lo_open else v >= lo) and v <= 1.0
            if not ok:
                rng = "(0, 1]" if lo_open else "[0, 1]"
                raise ConfigError(f"plugin_options['typical']['{name}']={v!r} is out of range; allowed: {rng}")
            object.__setattr__(self, name, float(v))

    @staticmethod
    def from_config(config: SpecConfig) -> "TypicalOptions":
        options = config.plugin_options.get(NAME, {})
        if not isinstance(options, dict):
            raise ConfigError(f"plugin_options['typical'] must be a dict, got {type(options).__name__}")
        known = {"posterior_threshold", "posterior_alpha"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"plugin_options['typical'] has unknown keys {unknown}; allowed: {sorted(known)}")
        return TypicalOptions(**options)


def _draws(B: int, N: int, device, uniforms) -> torch.Tensor:
    if uniforms is None:
        return torch.rand(B, N, 2, device=device, dtype=torch.float64)
    if tuple(uniforms.shape) != (B, N, 2):
        raise ValueError(f"uniforms must be [{B}, {N}, 2], got {tuple(uniforms.shape)}")
    return uniforms


def typical_walk(
    tokens: torch.Tensor,
    tree: TreeMeta,
    probs: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    threshold: float,
    alpha: float,
    max_depth: int,
) -> Acceptance:
    """The typical-acceptance walk (fixed shapes: `max_depth` rounds of [B, N] work, no host sync).

    Args:
        tokens: [B, N] int64 node tokens.
        tree: its `TreeMeta` (packed ancestor mask and depths are read).
        probs: [B, N, V] float32, the distribution each node samples its child from.
        uniforms: [B, N, 2] draws in [0, 1); column 1 draws the bonus token.
        threshold, alpha: posterior_threshold, posterior_alpha.
        max_depth: most draft nodes a path may accept.
    """
    B, N, _ = probs.shape
    device = tokens.device
    entropy = torch.special.entr(probs).sum(-1)  # [B, N] nats
    limit = torch.clamp(alpha * torch.exp(-entropy), max=threshold)  # [B, N]
    rows = torch.arange(B, device=device)
    node = torch.zeros(B, dtype=torch.int64, device=device)  # [B] current node
    length = torch.zeros(B, dtype=torch.int64, device=device)
    accept_nodes = torch.full((B, N), -1, dtype=torch.int64, device=device)
    accept_nodes[:, 0] = 0
    order = torch.arange(N, device=device)[None]  # [1, N]
    for _ in range(max_depth):
        words = tree.packed_mask.gather(2, (node // 32)[:, None, None].expand(B, N, 1))[..., 0]  # [B, N] int32
        below = ((words.to(torch.int64) >> (node % 32)[:, None]) & 1).bool()  # node is an ancestor-or-self
        child = below & (tree.positions == (tree.positions[rows, node] + 1)[:, None])  # [B, N]
        p_child = probs[rows, node].gather(1, tokens)  # [B, N] p(x) under the current node's distribution
        ok = child & (p_child > limit[rows, node][:, None])  # a stopped walk finds nothing again
        found = ok.any(-1)  # [B]
        first = torch.where(ok, order, N).min(-1).values  # [B] lowest acceptable index
        node = torch.where(found, first, node)
        length = length + found.to(torch.int64)
        accept_nodes.scatter_(1, length[:, None], torch.where(found, node, accept_nodes[rows, length])[:, None])
    bonus = sample_from_probs(probs[rows, node], uniforms[rows, node, 1])  # [B]
    path = accept_nodes.clamp(min=0)
    accept_tokens = torch.where(accept_nodes >= 0, tokens.gather(1, path), -1)
    accept_tokens = torch.cat([accept_tokens[:, 1:], accept_tokens.new_full((B, 1), -1)], 1)  # drop the root
    accept_tokens.scatter_(1, length[:, None], bonus[:, None])
    return Acceptance(accept_length=length, accept_nodes=accept_nodes, accept_tokens=accept_tokens)


class TypicalVerifier:
    """``verifier(tokens, tree, target_logits, sampling, ...) -> Acceptance`` (see the module docstring)."""

    lossless = False  # sampled rows do not follow the target distribution
    needs_draft_probs = False
    greedy_only = False

    def __init__(self, options: TypicalOptions, max_depth: int) -> None:
        self.options = options
        self.max_depth = max_depth

    def __call__(
        self,
        tokens: torch.Tensor,  # [B, N] int64
        tree: TreeMeta,
        target_logits: torch.Tensor,  # [B, N, V]
        sampling=None,  # SamplingTensors with [B] rows; None = all greedy
        *,
        draft_probs: torch.Tensor | None = None,  # ignored
        uniforms: torch.Tensor | None = None,  # [B, N, 2] float64 in [0, 1); None = fresh torch.rand draws
    ) -> Acceptance:
        B, N = tokens.shape
        probs = probs_for(target_logits, sampling)  # [B, N, V] float32
        draws = _draws(B, N, tokens.device, uniforms)
        return typical_walk(
            tokens,
            tree,
            probs,
            draws,
            threshold=self.options.posterior_threshold,
            alpha=self.options.posterior_alpha,
            max_depth=min(self.max_depth, N - 1),
        )

    def __repr__(self) -> str:
        return f"TypicalVerifier({self.options}, max_depth={self.max_depth})"


@strategy_hook(NAME)
def specdec_verify(config: SpecConfig):
    return TypicalVerifier(TypicalOptions.from_config(config), config.shape.max_draft_len)


specdec_strategy_names = declared_names(specdec_verify)
