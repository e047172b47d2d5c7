"""`NgramDrafter`: model-free prompt-lookup drafting, its trees grown by any greedy tree policy.

Owns, per request slot, the token history (the prompt as `prefill` sees it, then every
accepted token) and an index from each n-gram (n in [min_match, max_match]) to the
positions where it ends. Each step it matches the longest suffix of the history (between
max_match and min_match tokens) against its earlier occurrences (the 64 most recent,
`MAX_OCCURRENCES`, which bounds the work on degenerate, very repetitive text); the root's
candidates are the tokens that followed them. A draft node is a path from the root, and its
occurrences are those of its parent that continue with the node's token; its candidates are
the distinct tokens that follow, ranked by count (ties: the most recent occurrence first),
with log-probability log(count / occurrences). The tree policy (`linear`: a chain of the
most frequent continuation token by token; `dynamic`: EAGLE-2 over these counts; `static`:
a fixed shape) picks which candidates to expand and keep; nodes without a continuation are
padding, so a tree may hold fewer than `num_tree_slots` nodes. Sampling policies are
refused: counts are not a draft distribution to draw i.i.d. children from.

Where the work happens: matching is host-side Python, O(accepted tokens x max_match) to
update the index plus O(occurrences x depth x width) to expand, per slot per step, on CPU
tensors. Inside the engine it drafts between steps (`runs_on_host`): `propose_host` reads the
last step's tokens from the engine's token hand-off (already on the host), and the engine
copies the [B, N] tree to the device before the captured step, which then starts at tree
building. The history misses the prompt's first token: `prefill` receives the prompt
shifted by one (`Drafter.prefill` contract).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.checks import check_int, check_slot
from specdec.config import ConfigError, SpecConfig
from specdec.policies.shapes import builtin
from specdec.step_state import StepState
from specdec.types import Candidates, DraftTree, Frontier

__all__ = ["NgramOptions", "NgramIndex", "NgramDrafter", "MAX_OCCURRENCES"]

MAX_OCCURRENCES = 64
MAX_MATCH_LIMIT = 64


@dataclass(frozen=True)
class NgramOptions:
    """Matching of the n-gram drafter (``SpecConfig.plugin_options["ngram"]``).

    min_match / max_match: suffix lengths tried, longest first (1 <= min <= max <= 64).
    The tree's size and shape are the tree policy's (`tree`, `topk`, `max_total_draft_tokens`).
    """

    min_match: int = 1
    max_match: int = 3

    @staticmethod
    def from_config(config: SpecConfig, options: dict | None = None) -> "NgramOptions":
        """Validate ``options`` (a dict); defaults filled in."""
        options = dict(options or {})
        moved = sorted({"max_draft_tokens", "max_branches"} & set(options))
        if moved:
            raise ConfigError(
                f"plugin_options['ngram'] keys {moved} were removed: the tree's size and branching belong to the "
                "tree policy (SpecConfig.shape: max_total_draft_tokens, topk; SpecConfig.tree)"
            )
        known = {"min_match", "max_match"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"plugin_options['ngram'] has unknown keys {unknown}; allowed: {sorted(known)}")
        max_match = check_int("plugin_options['ngram']['max_match']", options.get("max_match", 3), 1, MAX_MATCH_LIMIT)
        min_match = check_int("plugin_options['ngram']['min_match']", options.get("min_match", 1), 1, max_match)
        return NgramOptions(min_match, max_match)


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

    def match(self) -> list[int]:
        """Earlier end positions (ascending, at most `MAX_OCCURRENCES`) of the longest suffix of
        the history, between max_match and min_match tokens, that occurred before; [] if none."""
        h = self.tokens
        last = len(h) - 1
        for n in range(self.max_match, self.min_match - 1, -1):
            if len(h) <= n:
                continue
            ends = self.ends[n].get(tuple(h[-n:]), [])
            earlier = [e for e in ends[-MAX_OCCURRENCES - 1 :] if e < last][-MAX_OCCURRENCES:]
            if earlier:
                return earlier
        return []

    def children(self, occurrences: list[int]) -> list[tuple[int, int, list[int]]]:
        """(token, count, the child's occurrences) of each distinct token that follows
        `occurrences` in the history, by count then most recent occurrence."""
        h = self.tokens
        follow: dict[int, list[int]] = {}
        for e in occurrences:
            if e + 1 < len(h):
                follow.setdefault(h[e + 1], []).append(e + 1)
        ranked = sorted(follow.items(), key=lambda kv: (-len(kv[1]), -kv[1][-1]))
        return [(tok, len(occ), occ) for tok, occ in ranked]


class NgramDrafter:
    """Prompt-lookup drafting (see the module docstring). Reads no hidden state.

    Args:
        config: the engine's `SpecConfig` (B; the tree policy's shape when `policy` is None).
        options: matching options.
        device: where `propose` puts its trees (host drafting is on CPU tensors).
        policy: a greedy tree policy (`samples=False`); None = the built-in one `config.tree` names.

    Capabilities (the `Drafter` protocol): reads = "nothing", runs_on_host = True,
    samples_drafts = False, num_tree_slots = policy.num_nodes + 1.
    """

    reads = "nothing"
    samples_drafts = False
    runs_on_host = True  # drafts between steps from the token hand-off (`propose_host`)

    def __init__(self, config: SpecConfig, options: NgramOptions, *, device: torch.device | str = "cpu", policy=None) -> None:
        self.options = options
        self.policy = policy if policy is not None else builtin(config, samples=False)
        if self.policy.samples:
            raise ConfigError(
                f"drafter='ngram' ranks counted continuations; tree={config.tree!r} needs i.i.d. draws from a draft "
                "distribution (use tree='linear', 'dynamic' or 'static', and a verifier that needs no draft probabilities)"
            )
        self.num_tree_slots = self.policy.num_nodes + 1  # N
        self.batch_size = config.cache.max_batch_size
        self.device = torch.device(device)
        self.slots: list[NgramIndex | None] = [None] * config.cache.max_batch_size

    def _check_slot(self, slot: int) -> None:
        check_slot(slot, self.batch_size)

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

    def _expander(self, roots: list[list[int] | None]):
        """`expand(Frontier) -> Candidates` on CPU tensors over each row's index; `roots[b]` =
        row b's root occurrences (None or [] = nothing to draft)."""
        kids: list[dict[tuple[int, int], list[int]]] = []  # per row: (frontier row, token) -> occurrences

        def expand(frontier: Frontier) -> Candidates:
            nonlocal kids
            B, K = len(roots), frontier.k
            if frontier.depth == 0:
                nodes = [[r or []] for r in roots]  # [B][F] occurrences of the frontier nodes
            else:
                toks, par = frontier.tokens.tolist(), frontier.parent_slot.tolist()
                nodes = [[kids[b].get(key, []) for key in zip(par[b], toks[b])] for b in range(B)]
            F = len(nodes[0])
            tokens = [[[0] * K for _ in range(F)] for _ in range(B)]
            logq = [[[-math.inf] * K for _ in range(F)] for _ in range(B)]
            kids = [{} for _ in range(B)]
            for b, index in enumerate(self.slots[:B]):
                for f, occ in enumerate(nodes[b]):
                    if not occ:
                        continue
                    ranked = index.children(occ)
                    total = sum(count for _, count, _ in ranked)
                    for j, (tok, count, child) in enumerate(ranked[:K]):
                        tokens[b][f][j], logq[b][f][j] = tok, math.log(count / total)
                        kids[b][(f, tok)] = child
            return Candidates(tokens=torch.tensor(tokens, dtype=torch.int64), logq=torch.tensor(logq, dtype=torch.float32))

        return expand

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
        B = len(root_tokens)
        roots: list[list[int] | None] = [None] * B
        for b in range(B):
            index = self.slots[b]
            if not active[b] or index is None:
                continue
            a = accept_length[b]
            if a >= 0:
                index.extend(accept_tokens[b][: a + 1])
            root = root_tokens[b]
            if index.tokens[-1] != root:
                raise RuntimeError(
                    f"ngram drafter out of sync in slot {b}: history ends with {index.tokens[-1]}, root token is {root}"
                )
            roots[b] = index.match()
        grown = self.policy.grow(self._expander(roots), B, torch.device("cpu"))
        root = torch.tensor(root_tokens, dtype=torch.int64)[:, None]
        tokens = torch.cat([root, grown.tokens], 1)  # [B, N]
        parents = torch.cat([torch.full((B, 1), -1, dtype=torch.int64), grown.parents], 1)
        return tokens, parents, grown.num_nodes + 1

    def propose(self, state: StepState, max_kv_len: int | None = None, draft: bool = True) -> DraftTree:
        """`propose_host` on a `StepState` (one device-to-host copy; for use outside the engine,
        which stages a host drafter's trees itself)."""
        packed = torch.cat(
            [
                state.accept_length[:, None],
                state.root_tokens[:, None],
                state.active[:, None].to(torch.int64),
                state.accept_tokens,
            ],
            dim=1,
        ).tolist()
        tokens, parents, num_nodes = self.propose_host(
            [row[0] for row in packed], [row[3:] for row in packed], [row[1] for row in packed], [bool(row[2]) for row in packed]
        )
        dev = self.device
        return DraftTree(tokens=tokens.to(dev), parents=parents.to(dev), num_nodes=num_nodes.to(dev))
