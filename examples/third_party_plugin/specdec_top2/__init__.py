"""A third-party specdec plugin with two strategies, using only public specdec objects:

- verifier="top2": accept a draft token if it is among the target's two most likely tokens
  there. Lossy (marked so); the bonus token is the argmax.
- tree="binary": a full binary draft tree (every node expands its top-2 candidates, every
  candidate is kept), depth ``plugin_options["binary"]["depth"]`` (default: max_draft_len);
  it needs ``max_total_draft_tokens >= 2 + 4 + ... + 2**depth``. A `FrontierPolicy`: it
  only says which candidates are expanded next and which the tree keeps, so every drafter
  that expands frontiers (eagle3, mtp, ngram) grows its trees without knowing it.

Installed with `pip install examples/third_party_plugin`, found through the entry-point group
`specdec`, selected with `SpecConfig(verifier="top2")` / `SpecConfig(tree="binary", ...)`.
"""

import torch

from specdec import Acceptance, declared_names, strategy_hook
from specdec.config import ConfigError
from specdec.plugins.options import plugin_options
from specdec.policies import FrontierPolicy


class Top2Verifier:
    lossless = False  # relaxed acceptance: output may differ from the target's greedy output
    needs_draft_probs = False
    greedy_only = True  # the bonus is the argmax: sampled requests are refused, not silently made greedy

    def __call__(self, tokens, tree, target_logits, sampling, *, uniforms=None, draft_probs=None):
        B, N = tokens.shape
        top2 = target_logits.topk(2, dim=-1).indices  # [B, N, 2]
        rows = torch.arange(B, device=tokens.device)
        nodes = torch.full((B, N), -1, dtype=torch.int64, device=tokens.device)
        out = torch.full((B, N), -1, dtype=torch.int64, device=tokens.device)
        nodes[:, 0] = 0
        cur = torch.zeros(B, dtype=torch.int64, device=tokens.device)
        length = torch.zeros(B, dtype=torch.int64, device=tokens.device)
        going = torch.ones(B, dtype=torch.bool, device=tokens.device)
        for _ in range(N - 1):  # one depth per iteration
            child, found = tree.next_token[rows, cur], torch.full_like(cur, -1)
            for _ in range(N - 1):  # walk siblings; the first one in the top-2 wins
                ok = (child >= 0) & (found < 0) & (top2[rows, cur] == tokens[rows, child.clamp(min=0)][:, None]).any(-1)
                found = torch.where(ok, child, found)
                child = torch.where(child >= 0, tree.next_sibling[rows, child.clamp(min=0)], child)
            going = going & (found >= 0)
            out[rows, length] = torch.where(going, tokens[rows, found.clamp(min=0)], out[rows, length])
            length = length + going.long()
            nodes[rows, length] = torch.where(going, found, nodes[rows, length])
            cur = torch.where(going, found, cur)
        out[rows, length] = target_logits[rows, cur].argmax(-1)  # bonus token
        return Acceptance(accept_length=length, accept_nodes=nodes, accept_tokens=out)


class BinaryPolicy(FrontierPolicy):
    """A full binary tree of `depth` levels: frontier widths 1, 2, 4, ..., two candidates each."""

    def __init__(self, depth: int, *, samples: bool = False) -> None:
        widths = tuple(2**t for t in range(depth))  # F_t nodes expanded at call t
        super().__init__(widths, (2,) * depth, 2 ** (depth + 1) - 2, samples=samples, name="binary")

    def _pick(self, t, score):  # score [B, F_t * 2]: every candidate is expanded next
        return torch.arange(score.shape[1], device=score.device).expand(score.shape[0], -1)

    def _select(self, scores):  # scores [B, M]: every candidate is kept (M = num_nodes)
        return torch.arange(scores.shape[1], device=scores.device).expand(scores.shape[0], -1)


def binary_policy(config, samples: bool) -> BinaryPolicy:
    """The binary policy for `config`, validated: ConfigError names the bad value and the range."""
    depth = plugin_options(config, "binary", {"depth"}).get("depth", config.shape.max_draft_len)
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= config.shape.max_draft_len:
        raise ConfigError(f"plugin_options['binary']['depth']={depth!r} is not allowed; allowed: ints in [1, {config.shape.max_draft_len}]")
    nodes = 2 ** (depth + 1) - 2
    if config.shape.max_total_draft_tokens < nodes:
        raise ConfigError(
            f"tree='binary' of depth {depth} has {nodes} nodes; max_total_draft_tokens="
            f"{config.shape.max_total_draft_tokens} is too small (allowed: >= {nodes})"
        )
    return BinaryPolicy(depth, samples=samples)


@strategy_hook("binary")
def specdec_tree_policy(config, verifier):
    # A fixed shape: with a verifier that needs draft probabilities, the children are i.i.d. draws.
    return binary_policy(config, samples=verifier.needs_draft_probs)


@strategy_hook("top2")
def specdec_verify(config):
    return Top2Verifier()


specdec_strategy_names = declared_names(specdec_verify, specdec_tree_policy)  # {"verifier": ["top2"], "tree": ["binary"]}
