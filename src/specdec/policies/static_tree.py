"""Static trees in the EAGLE-1 / Medusa "choices" format, validated, and laid out for
`StaticPolicy`.

A tree is a list of paths; path ``[c1, ..., cd]`` is the node reached from the root by
taking the c1-th candidate of the root (0 = the drafter's best), then the c2-th candidate of
that node, and so on. E.g. ``[[0], [1], [0, 0], [0, 1], [1, 0]]``: two children of the root,
two under the first, one under the second. The paths must be prefix-closed (every node's
parent is a node), distinct, at most `max_total_draft_tokens` of them and at most
`max_draft_len` deep.

`EAGLE1_DEFAULT` is the EAGLE-1 reference tree (its `mc_sim_7b_63` choices: 25 nodes, depth
5, four children at the root); with no paths given, the static policy takes its first
`budget` paths of depth <= `max_draft_len` (the list is ordered by depth, so any prefix of it
is prefix-closed). This file owns no tensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

__all__ = ["EAGLE1_DEFAULT", "StaticTree", "check_choices", "static_tree", "read_choices", "MAX_CHILD_INDEX"]

EAGLE1_DEFAULT: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)  # fmt: skip

MAX_CHILD_INDEX = 63  # candidate ranks, like topk <= 64


@dataclass(frozen=True)
class StaticTree:
    """A validated tree and its layout for the frontier loop (`FrontierPolicy`).

    paths:    the nodes, sorted by (depth, path): topological, tree index i + 1 = paths[i].
    widths:   F_t, nodes at depth t with children (F_0 = 1, the root), t < depth.
    children: K_t, candidates asked per frontier node at call t (largest child rank + 1).
    picks:    per call t < depth - 1, the call's candidate indices (frontier row * K_t + rank)
              of the nodes expanded at call t + 1.
    kept:     the history index of every node (call offset + frontier row * K + rank).
    """

    paths: tuple[tuple[int, ...], ...]
    widths: tuple[int, ...]
    children: tuple[int, ...]
    picks: tuple[tuple[int, ...], ...]
    kept: tuple[int, ...]


def check_choices(choices, *, budget: int, max_depth: int, source: str) -> tuple[tuple[int, ...], ...]:
    """Validate `choices` (see the module docstring); returns the paths sorted by (depth, path).

    Raises ConfigError naming the bad path and the rule it breaks.
    """
    if not isinstance(choices, (list, tuple)) or not choices:
        raise ConfigError(f"{source} must be a non-empty list of paths like [[0], [1], [0, 0]], got {choices!r}")
    paths = []
    for p in choices:
        if not isinstance(p, (list, tuple)) or not p:
            raise ConfigError(f"{source}: every path is a non-empty list of candidate ranks, got {p!r}")
        for c in p:
            if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= MAX_CHILD_INDEX:
                raise ConfigError(f"{source}: path {list(p)} has rank {c!r}; allowed: ints in [0, {MAX_CHILD_INDEX}]")
        paths.append(tuple(p))
    seen = set()
    for p in paths:
        if p in seen:
            raise ConfigError(f"{source}: path {list(p)} appears twice")
        seen.add(p)
    for p in paths:
        if len(p) > 1 and p[:-1] not in seen:
            raise ConfigError(
                f"{source}: path {list(p)} lacks its prefix {list(p[:-1])}; paths must be prefix-closed "
                "(every node's parent is a node)"
            )
    if len(paths) > budget:
        raise ConfigError(f"{source} has {len(paths)} paths; max_total_draft_tokens={budget} allows at most {budget}")
    deep = max(paths, key=len)
    if len(deep) > max_depth:
        raise ConfigError(f"{source}: path {list(deep)} is {len(deep)} deep; max_draft_len={max_depth} allows at most {max_depth}")
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


def layout(paths: tuple[tuple[int, ...], ...]) -> StaticTree:
    """The frontier loop's constants for sorted, validated `paths`."""
    depth = max(len(p) for p in paths)
    has_kids = {p[:-1] for p in paths}
    frontier = [[()]] + [[p for p in paths if len(p) == t and p in has_kids] for t in range(1, depth)]
    widths = tuple(len(f) for f in frontier)
    children = tuple(max(p[-1] for p in paths if len(p) == t + 1) + 1 for t in range(depth))
    row = [{node: f for f, node in enumerate(nodes)} for nodes in frontier]
    offsets = [0]
    for w, k in zip(widths, children):
        offsets.append(offsets[-1] + w * k)

    def local(p):  # index of node p among the candidates of call len(p) - 1
        t = len(p) - 1
        return row[t][p[:-1]] * children[t] + p[-1]

    picks = tuple(tuple(local(p) for p in frontier[t + 1]) for t in range(depth - 1))
    kept = tuple(offsets[len(p) - 1] + local(p) for p in paths)
    return StaticTree(paths=paths, widths=widths, children=children, picks=picks, kept=kept)


def static_tree(choices, *, budget: int, max_depth: int, source: str) -> StaticTree:
    """Validated layout of `choices`; None = the EAGLE-1 default cut to `budget` and `max_depth`."""
    if choices is None:
        choices = [p for p in EAGLE1_DEFAULT if len(p) <= max_depth][:budget]
        source = f"the EAGLE-1 default tree (first {len(choices)} paths)"
    return layout(check_choices(choices, budget=budget, max_depth=max_depth, source=source))


def read_choices(path) -> list[list[int]]:
    """Paths from a JSON file: a list of lists, or ``{"choices": [...]}``."""
    file = Path(path).expanduser()
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"tree choices file {file} does not exist") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"tree choices file {file} is not valid JSON: {e}") from None
    return data["choices"] if isinstance(data, dict) and "choices" in data else data
