"""`NgramDrafter`: model-free prompt-lookup drafting, as a chain or a tree of continuations.

Owns, per request slot, the token history (the prompt as `prefill` sees it, then every
accepted token) and an index from each n-gram (n in [min_match, max_match]) to the
positions where it ends. Each step it matches the longest suffix of the history (between
max_match and min_match tokens) against its earlier occurrences and proposes what followed
them:

- chain (tree="linear"): the continuation of the most frequent distinct continuation;
- tree (tree="dynamic"): each distinct continuation a branch, most frequent first (ties:
  the most recent occurrence first), up to `max_branches`, shared prefixes merged into one
  trie; nodes are numbered in insertion order, so parents precede children and the best
  branch is always the first child (sibling order = rank order).

Branches hold at most `max_draft_len` tokens; the tree holds at most `max_draft_tokens`
nodes (a branch that does not fit is cut where the budget ends). Only the 64 most recent
occurrences of the matched n-gram are considered (`MAX_OCCURRENCES`), which bounds the work
on degenerate, very repetitive text.

Where the work happens: matching is host-side Python, O(accepted tokens x max_match) to
update the index plus O(occurrences x depth) to match, per slot per step. Inside the engine
it drafts between steps (`runs_on_host`): `propose_host` reads the last step's tokens from
the engine's token hand-off (already on the host), and the engine copies the [B, N] tree
(N = max_draft_tokens + 1) to the device before the captured step, which then starts at
tree building. The history misses the prompt's first token: `prefill` receives
the prompt shifted by one (`Drafter.prefill` contract).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.config import ConfigError, SpecConfig
from specdec.strategies import DraftInput
from specdec.types import DraftTree

__all__ = ["NgramOptions", "NgramIndex", "NgramDrafter", "MAX_OCCURRENCES", "grow_tree"]

MAX_OCCURRENCES = 64
MAX_MATCH_LIMIT = 64


def _check_int(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"plugin_options['ngram']['{name}'] must be an int, got {value!r} ({type(value).__name__})")
    if not lo <= value <= hi:
        raise ConfigError(f"plugin_options['ngram']['{name}']={value} is out of range; allowed: [{lo}, {hi}]")
    return value


@dataclass(frozen=True)
class NgramOptions:
    """Matching and budget of the n-gram drafter (``SpecConfig.plugin_options["ngram"]``).

    min_match / max_match: suffix lengths tried, longest first (1 <= min <= max <= 64).
    max_draft_tokens: draft nodes per step, <= config.max_total_draft_tokens
        (default: config.max_total_draft_tokens).
    max_branches: distinct continuations proposed; 1 for tree="linear"
        (default: config.topk for tree="dynamic", else 1).
    """

    min_match: int = 1
    max_match: int = 3
    max_draft_tokens: int = 1
    max_branches: int = 1

    @staticmethod
    def from_config(config: SpecConfig, options: dict | None = None) -> "NgramOptions":
        """Validate ``options`` (a dict) against the engine's `config`; defaults filled in."""
        options = dict(options or {})
        known = {"min_match", "max_match", "max_draft_tokens", "max_branches"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"plugin_options['ngram'] has unknown keys {unknown}; allowed: {sorted(known)}")
        max_match = _check_int("max_match", options.get("max_match", 3), 1, MAX_MATCH_LIMIT)
        min_match = _check_int("min_match", options.get("min_match", 1), 1, max_match)
        budget = config.max_total_draft_tokens
        max_draft_tokens = _check_int("max_draft_tokens", options.get("max_draft_tokens", budget), 1, budget)
        dynamic = config.tree == "dynamic"
        default_branches = min(config.topk, max_draft_tokens) if dynamic else 1
        branches = options.get("max_branches", default_branches)
        if not dynamic and branches != 1:
            raise ConfigError(
                f"plugin_options['ngram']['max_branches']={branches!r} needs tree='dynamic'; tree='linear' drafts one chain"
            )
        branches = _check_int("max_branches", branches, 1, max_draft_tokens)
        return NgramOptions(min_match, max_match, max_draft_tokens, branches)


class NgramIndex:
    """One slot's token history and, for each n, n-gram -> end positions (ascending)."""

    def __init__(self, min_match: int, max_match: int) -> None:
        self.min_match, self.max_match = min_match, max_match
        self.tokens: list[int] = []
        self.ends: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in range(min_match, max_match + 1)}

    def extend(self, tokens) -> None:
        for tok in tokens:
            self.tokens.append(int(tok))
            i = len(self.tokens) - 1
            for n, table in self.ends.items():
                if i + 1 >= n:
                    table.setdefault(tuple(self.tokens[i - n + 1 : i + 1]), []).append(i)

    def continuations(self, depth: int) -> list[list[int]]:
        """Distinct continuations of the longest matched suffix, best first (see module docstring)."""
        h = self.tokens
        last = len(h) - 1
        for n in range(self.max_match, self.min_match - 1, -1):
            if len(h) <= n:
                continue
            ends = self.ends[n].get(tuple(h[-n:]), [])
            earlier = [e for e in ends[-MAX_OCCURRENCES - 1 :] if e < last][-MAX_OCCURRENCES:]
            if not earlier:
                continue
            stats: dict[tuple[int, ...], list[int]] = {}  # continuation -> [count, most recent end]
            for e in earlier:
                cont = tuple(h[e + 1 : e + 1 + depth])
                entry = stats.setdefault(cont, [0, e])
                entry[0] += 1
                entry[1] = max(entry[1], e)
            ranked = sorted(stats.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
            return [list(cont) for cont, _ in ranked]
        return []


def grow_tree(branches: list[list[int]], max_branches: int, budget: int) -> tuple[list[int], list[int]]:
    """Merge up to `max_branches` branches into a trie of at most `budget` draft nodes.

    Returns:
        (tokens, parents) of the draft nodes 1..S in insertion (topological) order;
        parents are tree indices (0 = the root).
    """
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}  # (parent index, token) -> node index
    for branch in branches[:max_branches]:
        node = 0
        for tok in branch:
            nxt = children.get((node, tok))
            if nxt is None:
                if len(tokens) >= budget:
                    return tokens, parents
                tokens.append(tok)
                parents.append(node)
                nxt = len(tokens)
                children[(node, tok)] = nxt
            node = nxt
    return tokens, parents


class NgramDrafter:
    """Prompt-lookup drafting (see the module docstring). Reads no hidden state.

    Attributes (the `Drafter` protocol): needs_hidden_states = False, needs_last_hidden =
    False, samples_drafts = False, num_tree_slots = max_draft_tokens + 1.
    """

    needs_hidden_states = False
    needs_last_hidden = False
    samples_drafts = False
    runs_on_host = True  # drafts between steps from the token hand-off (`propose_host`)

    def __init__(self, config: SpecConfig, options: NgramOptions, *, device: torch.device | str = "cpu") -> None:
        self.options = options
        self.depth = min(config.max_draft_len, options.max_draft_tokens)
        self.num_tree_slots = options.max_draft_tokens + 1  # N
        self.batch_size = config.max_batch_size
        self.device = torch.device(device)
        self.slots: list[NgramIndex | None] = [None] * config.max_batch_size

    def _check_slot(self, slot: int) -> None:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.batch_size:
            raise ValueError(f"slot={slot!r} is out of range; allowed: [0, {self.batch_size})")

    def prefill(self, slot: int, next_tokens: torch.Tensor, hidden: torch.Tensor | None = None, start: int = 0) -> None:
        """Grow `slot`'s history with a prompt chunk (shifted by one; the last chunk ends with the
        first generated token); `start == 0` starts a new history."""
        self._check_slot(slot)
        if start == 0 or self.slots[slot] is None:
            self.slots[slot] = NgramIndex(self.options.min_match, self.options.max_match)
        self.slots[slot].extend(next_tokens.reshape(-1).tolist())

    def reset_slot(self, slot: int) -> None:
        self._check_slot(slot)
        self.slots[slot] = None

    def draft(self, slot: int) -> tuple[list[int], list[int]]:
        """(tokens, parents) of `slot`'s draft nodes 1..S from its current history."""
        index = self.slots[slot]
        if index is None:
            return [], []
        branches = index.continuations(self.depth)
        return grow_tree(branches, self.options.max_branches, self.options.max_draft_tokens)

    def propose_host(
        self, accept_length: list[int], accept_tokens: list[list[int]], root_tokens: list[int], active: list[bool]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append last step's emitted tokens to each history, then match (host side, between steps).

        Args (one entry per row of the step's batch bucket, from the token hand-off):
            accept_length: accepted drafts of the last step (-1 right after prefill).
            accept_tokens: the tokens the last step emitted (a accepted drafts, then the bonus).
            root_tokens: each row's newest token (the tree's root).
            active: rows holding a live request.
        Returns:
            CPU int64 tensors tokens [B, N], parents [B, N] and num_nodes [B].
        """
        B, N = len(root_tokens), self.num_tree_slots
        tokens = torch.zeros(B, N, dtype=torch.int64)
        parents = torch.full((B, N), -1, dtype=torch.int64)
        num_nodes = torch.ones(B, dtype=torch.int64)
        for b in range(B):
            root, a = root_tokens[b], accept_length[b]
            tokens[b, 0] = root
            index = self.slots[b]
            if not active[b] or index is None:
                continue
            if a >= 0:
                index.extend(accept_tokens[b][: a + 1])
            if index.tokens[-1] != root:
                raise RuntimeError(
                    f"ngram drafter out of sync in slot {b}: history ends with {index.tokens[-1]}, root token is {root}"
                )
            draft, par = self.draft(b)
            S = len(draft)
            tokens[b, 1 : S + 1] = torch.tensor(draft, dtype=torch.int64)
            parents[b, 1 : S + 1] = torch.tensor(par, dtype=torch.int64)
            num_nodes[b] = S + 1
        return tokens, parents, num_nodes

    def propose(self, inputs: DraftInput) -> DraftTree:
        """`propose_host` on a `DraftInput` (one device-to-host copy; for use outside the engine)."""
        packed = torch.cat(
            [
                inputs.accept_length[:, None],
                inputs.root_tokens[:, None],
                inputs.active[:, None].to(torch.int64),
                inputs.accept_tokens,
            ],
            dim=1,
        ).tolist()
        tokens, parents, num_nodes = self.propose_host(
            [row[0] for row in packed], [row[3:] for row in packed], [row[1] for row in packed], [bool(row[2]) for row in packed]
        )
        dev = self.device
        return DraftTree(tokens=tokens.to(dev), parents=parents.to(dev), num_nodes=num_nodes.to(dev))
