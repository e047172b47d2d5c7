"""The per-category held-out evaluation set (``categories_heldout.jsonl``) and the category of a prompt.

Categories (`CATEGORIES`), the kinds of request a user sends:

- ``code-long-context``: code to continue after up to ~1000 characters of a held-out stdlib
  file (the code prompts of the older ``heldout_prompts.jsonl``);
- ``code-short-header``: a def line + docstring (or comment) alone (`mix` headers, held-out
  domains or styles);
- ``chat-about-code``: questions about a function of a held-out file (the older set's chat
  prompts) and requests on held-out programming topics or templates;
- ``general-chat``: requests on held-out everyday / science / ... topics or templates;
- ``math``: word problems of held-out templates or topics;
- ``multi-turn``: 2-3 user turns, the earlier answers the target's own (greedy), seeds and
  follow-ups held out.

Every prompt is held out by construction (`mix.split_of`; source files by `prompts.is_heldout`).
The set is frozen: `frozen_category_prompts` reads the shipped file, so every machine evaluates
the same prompts. Regenerate it (deterministic: greedy fp32 answers of the bundled SmolLM2 for
the multi-turn histories; every other category is a pure function of the seed) with::

    python -m specdec.train categories --target smollm2 --device cpu --dtype float32 \\
        --write src/specdec/train/categories_heldout.jsonl
"""

from __future__ import annotations

import random
from pathlib import Path

from .expand import build_conversations
from .mix import header_prompts, instruct_prompts, math_prompts
from .prompts import QUESTIONS, Prompt, dedup, frozen_heldout_prompts, read_prompts

__all__ = ["CATEGORIES", "FROZEN_CATEGORIES", "PER_CATEGORY", "category_of", "frozen_category_prompts",
           "make_categories_heldout"]

CATEGORIES = ("code-long-context", "code-short-header", "chat-about-code", "general-chat", "math", "multi-turn")
PER_CATEGORY = 16
FROZEN_CATEGORIES = Path(__file__).with_name("categories_heldout.jsonl")
_KIND_CATEGORY = {"code": "code-long-context", "task": "chat-about-code", "general": "chat-about-code",
                  **{k: "chat-about-code" for k in QUESTIONS}, **{c: c for c in CATEGORIES}}


def category_of(prompt: Prompt) -> str:
    """The category of a prompt from its kind (source-file kinds map onto code categories;
    kinds outside `CATEGORIES`, e.g. ``edit``, are their own category)."""
    return _KIND_CATEGORY.get(prompt.kind, prompt.kind)


def _round_robin(prompts: list[Prompt], key, n: int, seed: str) -> list[Prompt]:
    """`n` prompts taking one of each `key` group in turn (groups and members in a seeded order)."""
    groups: dict[str, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(key(p), []).append(p)
    rng = random.Random(seed)
    names = sorted(groups)
    rng.shuffle(names)
    for g in names:
        rng.shuffle(groups[g])
    out: list[Prompt] = []
    while len(out) < n and any(groups.values()):
        for g in names:
            if groups[g] and len(out) < n:
                out.append(groups[g].pop())
    return out


def _template(p: Prompt) -> str:
    return p.source.split("|")[1]


def make_categories_heldout(generate, per_category: int = PER_CATEGORY, seed: int = 0) -> list[Prompt]:
    """The recipe of the shipped set: `per_category` held-out prompts of each of `CATEGORIES`, in that order.

    Args:
        generate: a `expand.Generate` (e.g. `expand.target_generate(target)`) for the earlier
            answers of the multi-turn conversations.
    """
    if per_category < 2:
        raise ValueError(f"per_category={per_category} must be >= 2")
    old = frozen_heldout_prompts()
    old_code = [p for p in old if not p.chat]
    old_chat = [p for p in old if p.chat]
    instruct = dedup(instruct_prompts("heldout"))
    general = [p for p in instruct if p.kind == "general-chat"]
    code_chat = [p for p in instruct if p.kind == "chat-about-code"]
    s = f"specdec-categories:{seed}"
    general_pick = _round_robin(general, _template, 2 * per_category, s + ":general")  # half seed the conversations
    half = per_category // 2
    sets = {
        "code-long-context": old_code[:per_category],
        "code-short-header": _round_robin(header_prompts("heldout"), _template, per_category, s + ":header"),
        "chat-about-code": old_chat[:half] + _round_robin(code_chat, _template, per_category - half, s + ":code-chat"),
        "general-chat": general_pick[:per_category],
        "math": math_prompts("heldout", per_category, seed),
        "multi-turn": build_conversations(generate, general_pick[per_category:], turns=(2, 3), seed=seed, split="heldout"),
    }
    short = {c: len(v) for c, v in sets.items() if len(v) != per_category}
    if short:
        raise ValueError(f"categories {short} have fewer than per_category={per_category} held-out prompts")
    return [p for c in CATEGORIES for p in sets[c]]


def frozen_category_prompts(n: int | None = None, categories: tuple[str, ...] | None = None) -> list[Prompt]:
    """The shipped per-category evaluation set; with `n`, the first n of each chosen category."""
    if not FROZEN_CATEGORIES.is_file():
        raise FileNotFoundError(f"{FROZEN_CATEGORIES} (frozen category prompts) is missing from the specdec package")
    chosen = CATEGORIES if categories is None else tuple(categories)
    unknown = sorted(set(chosen) - set(CATEGORIES))
    if unknown:
        raise ValueError(f"unknown categories {unknown}; allowed: {list(CATEGORIES)}")
    prompts = read_prompts(FROZEN_CATEGORIES)
    by_cat = {c: [p for p in prompts if category_of(p) == c] for c in chosen}
    most = min(len(v) for v in by_cat.values())
    if n is not None and not 1 <= n <= most:
        raise ValueError(f"n={n} prompts per category asked for; allowed: [1, {most}]")
    return [p for c in chosen for p in by_cat[c][:n]]
