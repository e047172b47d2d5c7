"""Diverse training and evaluation prompts made locally, with the held-out split by construction.

Owns the templated prompt families that do not come from source files:

- ``general-chat`` / ``chat-about-code``: instruction-style requests (explain, compare, write,
  summarize, plan, story, everyday, facts) from `TOPICS` (domains of seed topics; the
  ``programming`` domain makes chat about code) x `INSTRUCT_TEMPLATES`;
- ``math``: word problems from `MATH_TEMPLATES` x `MATH_TOPICS` (the numbers drawn by a seeded RNG);
- ``code-short-header``: raw text to continue, a def line + docstring (or comment) from
  `HEADERS` (function specs by domain) x `HEADER_STYLES`;

and `sample_mix`, the training mix: these families + the source-file prompts of `prompts`
(+ optionally the target's own expansions of `expand`: self-instruct and multi-turn).

Split by construction: a templated prompt is held out iff its topic (or function domain) or its
template (or style) is in a held-out list (`HELDOUT_TOPICS`, `HELDOUT_TEMPLATES`, ...), so a
held-out prompt is a kind of request training never saw: an unseen topic or an unseen way of
asking, not merely an unseen file. `Prompt.source` is ``mix:<family>:<topic>|<template>``
and `split_of` decides the split from it alone. Every list is sorted and every draw seeded, so
the same seed gives the same prompts on every machine. Duplicates (by `normalize`) are dropped;
`normalize` and `dedup` live in `prompts` (re-exported here), so `expand`, which `mix` imports,
uses them without importing `mix`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..checks import check_int
from .expand import HELDOUT_FOLLOW_UPS, build_conversations, self_instruct
from .prompts import ROOTS, Prompt, dedup, normalize, sample_prompts
from .wide_topics import MORE_TEMPLATES, MORE_TOPICS

__all__ = [
    "FAMILIES",
    "HEADER_STYLES",
    "HEADERS",
    "INSTRUCT_POOLS",
    "INSTRUCT_TEMPLATES",
    "MATH_TEMPLATES",
    "MixConfig",
    "TOPICS",
    "dedup",
    "family_prompts",
    "normalize",
    "sample_mix",
    "split_of",
]

# --------------------------------------------------------------------------- instruction requests
TOPICS: dict[str, tuple[str, ...]] = {
    "science": ("photosynthesis", "black holes", "volcanoes", "the water cycle", "vaccines", "static electricity"),
    "history": ("the printing press", "the Roman Empire", "the Industrial Revolution", "the Silk Road", "ancient Egypt",
                "the first Moon landing"),
    "cooking": ("baking bread", "making soup", "knife skills", "fermentation", "spices", "meal preparation"),
    "health": ("sleep", "drinking enough water", "stretching", "stress", "healthy breakfasts", "walking every day"),
    "travel": ("packing light", "train travel", "visiting museums", "learning a few words of a language before a trip",
               "travel insurance", "jet lag"),
    "money": ("saving money", "compound interest", "budgeting", "credit cards", "inflation", "comparing prices"),
    "nature": ("bees", "coral reefs", "bird migration", "rainforests", "mushrooms", "octopuses"),
    "arts": ("jazz", "watercolor painting", "learning the guitar", "photography", "poetry", "theatre"),
    "everyday": ("keeping a tidy home", "gardening on a balcony", "time management", "writing a shopping list",
                 "moving to a new city", "making friends as an adult"),
    "sports": ("running", "swimming", "chess", "yoga", "cycling to work", "team sports"),
    "programming": ("recursion", "hash tables", "Git branches", "unit testing", "regular expressions", "SQL joins",
                    "REST APIs", "object-oriented programming", "sorting algorithms", "asynchronous programming"),
}
HELDOUT_TOPICS = frozenset({
    "static electricity", "the first Moon landing", "meal preparation", "walking every day", "jet lag", "comparing prices",
    "octopuses", "theatre", "making friends as an adult", "team sports", "SQL joins", "asynchronous programming",
})
# template id -> (family, text); {t} the topic, {u} a second topic of the same domain (compare)
INSTRUCT_TEMPLATES: dict[str, tuple[str, str]] = {
    "explain-simple": ("explain", "Explain {t} in simple terms."),
    "explain-how": ("explain", "How does {t} work?"),
    "explain-child": ("explain", "How would you explain {t} to a ten-year-old?"),
    "compare": ("compare", "What is the difference between {t} and {u}?"),
    "compare-pros": ("compare", "Compare {t} and {u}. What are the advantages of each?"),
    "write-paragraph": ("write", "Write a short paragraph about {t}."),
    "write-poem": ("write", "Write a short poem about {t}."),
    "write-email": ("write", "Write a friendly email inviting a friend to a talk about {t}."),
    "summarize": ("summarize", "Summarize the key ideas of {t} in three bullet points."),
    "summarize-one": ("summarize", "Give me a one-sentence summary of what {t} is about."),
    "plan-learn": ("plan", "Make a four-week plan for learning about {t}."),
    "plan-start": ("plan", "I want to get started with {t}. What steps should I take?"),
    "story": ("story", "Write a short story in which {t} plays an important role."),
    "story-bedtime": ("story", "Tell a short bedtime story for children about {t}."),
    "everyday-tips": ("everyday", "What are some practical tips about {t}?"),
    "everyday-mistakes": ("everyday", "What are common mistakes people make with {t}?"),
    "everyday-why": ("everyday", "Why should I care about {t}?"),
    "facts": ("facts", "Tell me three interesting facts about {t}."),
}
HELDOUT_TEMPLATES = frozenset({"explain-child", "compare-pros", "write-email", "summarize-one", "story-bedtime", "everyday-why"})

# --------------------------------------------------------------------------- math word problems
MATH_TOPICS: dict[str, tuple[str, str]] = {  # topic -> (item, unit price range "lo-hi")
    "fruit": ("apples", "1-4"), "books": ("notebooks", "2-9"), "tickets": ("concert tickets", "15-60"),
    "plants": ("flower pots", "3-12"), "bakery": ("muffins", "2-5"), "stationery": ("pencils", "1-3"),
    "toys": ("toy cars", "4-15"), "garden": ("bags of soil", "5-20"),
}
HELDOUT_MATH_TOPICS = frozenset({"toys", "garden"})
NAMES = ("Ana", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Leo")
MATH_TEMPLATES: dict[str, str] = {
    "buy": "{name} buys {a} {item} at ${p} each. How much does {name} spend?",
    "change": "{name} buys {a} {item} at ${p} each and pays with a ${bill} bill. How much change does {name} get?",
    "share": "{name} has {ab} {item} and shares them equally among {b} friends. How many does each friend get?",
    "left": "{name} had {c} {item}, sold {a} in the morning and {b} in the afternoon. How many are left?",
    "discount": "{item_cap} cost ${p} each. With a {pct}% discount, how much do {a} of them cost?",
    "rate": "A shop sells {a} {item} every hour. How many does it sell in {b} hours and 30 minutes?",
    "compare": "{name} pays ${p} for each of {a} {item}; {name2} pays ${q} for each of {b}. Who spends more, and by how much?",
    "average": "On three days {name} sold {a}, {b} and {c} {item}. What is the average number sold per day?",
    "ratio": "{name} and {name2} split {tot} {item} in the ratio {a}:{b}. How many does each get?",
    "steps": ("{name} buys {a} {item} at ${p} each and {b} more at ${q} each, then returns {r}. Solve step by step: "
              "how much did {name} spend in the end if returns are refunded at ${p} each?"),
}
HELDOUT_MATH_TEMPLATES = frozenset({"ratio", "steps", "average"})

# --------------------------------------------------------------------------- short code headers
# domain -> (name, typed parameters, return annotation, docstring summary)
HEADERS: dict[str, tuple[tuple[str, str, str, str], ...]] = {
    "strings": (
        ("is_palindrome", "s: str", "bool", "Return True if s reads the same forwards and backwards, ignoring case."),
        ("count_vowels", "text: str", "int", "Count the vowels in text."),
        ("title_case", "sentence: str", "str", "Capitalize the first letter of every word in sentence."),
        ("longest_word", "text: str", "str", "Return the longest word in text (the first one on ties)."),
        ("is_anagram", "a: str, b: str", "bool", "Return True if a and b are anagrams of each other."),
    ),
    "lists": (
        ("chunk", "items: list, size: int", "list[list]", "Split items into consecutive chunks of length size."),
        ("flatten", "nested: list", "list", "Flatten an arbitrarily nested list into a flat list."),
        ("dedupe", "items: list", "list", "Remove duplicates from items, keeping the first occurrence order."),
        ("rotate", "items: list, k: int", "list", "Rotate items to the right by k positions."),
        ("second_largest", "numbers: list[int]", "int", "Return the second largest distinct number in numbers."),
    ),
    "numbers": (
        ("is_prime", "n: int", "bool", "Return True if n is a prime number."),
        ("fibonacci", "n: int", "int", "Return the n-th Fibonacci number, with fibonacci(0) == 0."),
        ("digit_sum", "n: int", "int", "Return the sum of the decimal digits of n."),
        ("gcd", "a: int, b: int", "int", "Return the greatest common divisor of a and b."),
        ("to_binary", "n: int", "str", "Return the binary representation of a non-negative integer n."),
    ),
    "dicts": (
        ("invert", "mapping: dict", "dict", "Swap the keys and values of mapping."),
        ("merge_counts", "a: dict[str, int], b: dict[str, int]", "dict[str, int]", "Merge two word-count dictionaries by adding counts."),
        ("group_by_length", "words: list[str]", "dict[int, list[str]]", "Group words by their length."),
        ("top_k", "counts: dict[str, int], k: int", "list[str]", "Return the k keys with the highest counts."),
    ),
    "files": (
        ("count_lines", "path: str", "int", "Return the number of lines in the text file at path."),
        ("read_json", "path: str", "dict", "Load and return the JSON object stored in the file at path."),
        ("find_files", "root: str, suffix: str", "list[str]", "Return the paths under root whose names end with suffix."),
        ("tail", "path: str, n: int", "list[str]", "Return the last n lines of the file at path."),
    ),
    "dates": (
        ("is_leap_year", "year: int", "bool", "Return True if year is a leap year in the Gregorian calendar."),
        ("days_between", "a: str, b: str", "int", "Return the number of days between two ISO dates."),
        ("weekday_name", "date: str", "str", "Return the English weekday name of an ISO date."),
        ("age", "birthday: str, today: str", "int", "Return the age in whole years on today of someone born on birthday."),
    ),
    "geometry": (
        ("circle_area", "r: float", "float", "Return the area of a circle of radius r."),
        ("distance", "p: tuple[float, float], q: tuple[float, float]", "float", "Return the Euclidean distance between points p and q."),
        ("triangle_area", "a: float, b: float, c: float", "float", "Return the area of a triangle with sides a, b and c."),
        ("bounding_box", "points: list[tuple[float, float]]", "tuple[float, float, float, float]", "Return the bounding box of points."),
    ),
    "parsing": (
        ("parse_csv_line", "line: str", "list[str]", "Split one CSV line into fields, honouring double quotes."),
        ("parse_duration", "text: str", "int", "Convert a duration like '1h30m' to seconds."),
        ("extract_emails", "text: str", "list[str]", "Return every email address found in text."),
        ("parse_query", "query: str", "dict[str, str]", "Parse a URL query string such as 'a=1&b=2' into a dict."),
    ),
}
HELDOUT_HEADER_DOMAINS = frozenset({"dates", "geometry"})
HEADER_STYLES = ("plain", "typed", "method", "imports", "google", "comment")
HELDOUT_HEADER_STYLES = frozenset({"google", "comment"})

FAMILIES = ("instruct", "math", "header")
SPLITS = ("train", "heldout")
INSTRUCT_POOLS = ("base", "wide")  # base: TOPICS x INSTRUCT_TEMPLATES; wide: + `wide_topics` (training breadth)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is unknown; allowed: {list(SPLITS)}")


def split_of(source: str) -> str:
    """The split of a templated prompt from its source id ``mix:<family>:<topic>|<template>...``:
    "heldout" iff its topic or its template is held out (extra ``|...`` parts, as added by
    `expand`, are held out iff they name a held-out follow-up)."""
    parts = source.split(":", 2)
    if len(parts) != 3 or parts[0] != "mix" or parts[1] not in FAMILIES:
        raise ValueError(f"source={source!r} is not a mix source; allowed: 'mix:<family>:<topic>|<template>' "
                         f"with family in {list(FAMILIES)}")
    family, rest = parts[1], parts[2].split("|")
    topic, template = rest[0], rest[1] if len(rest) > 1 else ""
    held_topics, held_templates = {
        "instruct": (HELDOUT_TOPICS, HELDOUT_TEMPLATES),
        "math": (HELDOUT_MATH_TOPICS, HELDOUT_MATH_TEMPLATES),
        "header": (HELDOUT_HEADER_DOMAINS, HELDOUT_HEADER_STYLES),
    }[family]

    # extra parts: follow-up ids of multi-turn prompts (`expand`)
    extra_held = any(p.startswith("mt:") and p[3:] in HELDOUT_FOLLOW_UPS for p in rest[2:])
    return "heldout" if topic in held_topics or template in held_templates or extra_held else "train"


def _topic_category(domain: str) -> str:
    return "chat-about-code" if domain == "programming" else "general-chat"


def _check_pool(pool: str) -> None:
    if pool not in INSTRUCT_POOLS:
        raise ValueError(f"instruct pool={pool!r} is unknown; allowed: {list(INSTRUCT_POOLS)}")


def _requests(split: str, topics_by_domain: dict[str, tuple[str, ...]], templates: dict[str, tuple[str, str]]) -> list[Prompt]:
    """The (topic, template) requests of `split`, domains and template ids sorted."""
    out = []
    for domain in sorted(topics_by_domain):
        topics = topics_by_domain[domain]
        for i, t in enumerate(topics):
            for tid in sorted(templates):
                source = f"mix:instruct:{t}|{tid}"
                if split_of(source) != split:
                    continue
                # a comparison's second topic: the next one of the list (a training one in training)
                peers = [u for u in topics[i + 1 :] + topics[:i] if split == "heldout" or u not in HELDOUT_TOPICS]
                text = templates[tid][1].format(t=t, u=peers[0])
                out.append(Prompt(_topic_category(domain), source, text[0].upper() + text[1:], True))
    return out


def instruct_prompts(split: str, pool: str = "base") -> list[Prompt]:
    """Every (topic, template) request of `split` in `pool`, one prompt per pair: "base" is
    `TOPICS` x `INSTRUCT_TEMPLATES` (sorted; what the frozen evaluation set was drawn from),
    "wide" those and `wide_topics`' (training topics and ways of asking only): base topics x
    `MORE_TEMPLATES`, `MORE_TOPICS` x every template (a comparison pairs topics of one list)."""
    _check_split(split)
    _check_pool(pool)
    out = _requests(split, TOPICS, INSTRUCT_TEMPLATES)
    if pool == "wide":
        out += _requests(split, TOPICS, MORE_TEMPLATES)
        out += _requests(split, MORE_TOPICS, {**INSTRUCT_TEMPLATES, **MORE_TEMPLATES})
    return out


def _price(rng: random.Random, spec: str) -> int:
    lo, hi = (int(x) for x in spec.split("-"))
    return rng.randint(lo, hi)


def math_prompt(topic: str, template: str, rng: random.Random) -> Prompt:
    """One word problem of (topic, template), its numbers and names drawn from `rng`."""
    if topic not in MATH_TOPICS or template not in MATH_TEMPLATES:
        raise ValueError(f"math (topic, template)=({topic!r}, {template!r}); allowed topics {sorted(MATH_TOPICS)}, "
                         f"templates {sorted(MATH_TEMPLATES)}")
    item, prices = MATH_TOPICS[topic]
    a, b = rng.randint(2, 9), rng.randint(2, 6)
    p, q = _price(rng, prices), _price(rng, prices)
    name, name2 = rng.sample(NAMES, 2)
    values = dict(name=name, name2=name2, item=item, item_cap=item[0].upper() + item[1:], a=a, b=b,
                  ab=a * b * rng.randint(1, 3), c=a + b + rng.randint(1, 20), tot=(a + b) * rng.randint(1, 4), p=p, q=q,
                  bill=-(-(a * p + 1) // 10) * 10, pct=rng.choice((10, 20, 25, 50)), r=rng.randint(1, a))
    return Prompt("math", f"mix:math:{topic}|{template}", MATH_TEMPLATES[template].format(**values), True)


def math_prompts(split: str, n: int, seed: int = 0) -> list[Prompt]:
    """`n` distinct word problems of `split`, cycling over its (topic, template) pairs in a seeded order."""
    _check_split(split)
    pairs = [(t, m) for t in sorted(MATH_TOPICS) for m in sorted(MATH_TEMPLATES) if split_of(f"mix:math:{t}|{m}") == split]
    rng = random.Random(f"specdec-mix-math:{seed}:{split}")
    rng.shuffle(pairs)
    out: list[Prompt] = []
    for k in range(20 * n):
        if len(out) >= n:
            break
        out = dedup(out + [math_prompt(*pairs[k % len(pairs)], rng)])
    return out


def _untyped(params: str) -> str:
    return re.sub(r":\s*[^,]+?(?=,|$)", "", _split_params(params))


def _split_params(params: str) -> str:
    """Parameters with commas inside brackets protected (so annotations like tuple[a, b] strip cleanly)."""
    depth, out = 0, []
    for ch in params:
        depth += 1 if ch in "[(" else -1 if ch in "])" else 0
        out.append("\x00" if ch == "," and depth > 0 else ch)
    return "".join(out)


def header_text(spec: tuple[str, str, str, str], style: str) -> str:
    """A short code header to continue: the def line + docstring of `spec` in `style`."""
    name, params, ret, doc = spec
    plain = _untyped(params).replace("\x00", ",")
    typed = f"def {name}({params}) -> {ret}:"
    if style == "plain":
        return f'def {name}({plain}):\n    """{doc}"""\n'
    if style == "typed":
        return f'{typed}\n    """{doc}"""\n'
    if style == "method":
        cls = "".join(w.capitalize() for w in name.split("_")) + "Helper"
        return f'class {cls}:\n    def {name}(self, {params}) -> {ret}:\n        """{doc}"""\n'
    if style == "imports":
        return f'from __future__ import annotations\n\nimport math\nimport re\n\n\n{typed}\n    """{doc}"""\n'
    if style == "google":
        args = "\n".join(f"        {p.split(':')[0].strip()}: the {p.split(':')[0].strip()}." for p in _split_params(params).split(","))
        return f'{typed}\n    """{doc}\n\n    Args:\n{args}\n\n    Returns:\n        {ret}: the result.\n    """\n'
    if style == "comment":
        return f"# {doc}\ndef {name}({plain}):\n"
    raise ValueError(f"header style={style!r} is unknown; allowed: {list(HEADER_STYLES)}")


def header_prompts(split: str) -> list[Prompt]:
    """Every (function, style) short header of `split` (raw text, no chat template)."""
    _check_split(split)
    out = []
    for domain in sorted(HEADERS):
        for spec in HEADERS[domain]:
            for style in HEADER_STYLES:
                source = f"mix:header:{domain}|{style}|{spec[0]}"
                if split_of(source) == split:
                    out.append(Prompt("code-short-header", source, header_text(spec, style), False))
    return out


def family_prompts(family: str, split: str, n: int, seed: int = 0, variants: int = 1,
                   pool: str = "base") -> list[Prompt]:
    """`n` prompts (fewer if the family runs dry) of one templated family and split, seeded order.

    instruct and header have a fixed number of (topic, template) pairs (instruct: those of
    `pool`, see `instruct_prompts`); with ``variants > 1`` each pair may come back up to
    ``variants - 1`` more times as a sampled variant (`Prompt.variant`), every distinct prompt
    once before any repeat. math draws new numbers instead, so it never repeats.
    """
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is unknown; allowed: {list(FAMILIES)}")
    check_int("n", n, 0, error=ValueError)
    check_int("variants", variants, 1, error=ValueError, note=" (1: every prompt once, greedy)")
    if family == "math":
        return math_prompts(split, n, seed)
    _check_pool(pool)
    prompts = dedup(instruct_prompts(split, pool) if family == "instruct" else header_prompts(split))
    random.Random(f"specdec-mix-{family}:{seed}:{split}").shuffle(prompts)
    return [replace(p, variant=v) for v in range(variants) for p in prompts][:n]


# --------------------------------------------------------------------------- the training mix
Generate = Callable[[list[list[dict]]], list[str]]


@dataclass(frozen=True)
class MixConfig:
    """Shares of the training mix (normalized; each >= 0), for `sample_mix`.

    source: prompts from Python source files (`prompts.sample_prompts`, their own kind mix);
    instruct / math / header: the templated families; self_instruct: requests the target writes
    from instruct seeds; multi_turn: conversations the target continues (both need `generate`).
    max_variants: how many times an instruct or header prompt may appear (its greedy answer,
    then sampled ones, `Prompt.variant`) before the rest of its share goes to source prompts:
    these families have a few hundred distinct prompts, far fewer than their share of a
    20000-prompt mix.
    instruct_pool: the instruction requests (and the self-instruct and multi-turn seeds) come
    from `instruct_prompts(split, instruct_pool)`: "wide" (default) 11616 training requests over 359
    topics and 32 ways of asking, "base" the 696 of `TOPICS` x `INSTRUCT_TEMPLATES` alone.
    """

    source: float = 0.40
    instruct: float = 0.20
    math: float = 0.10
    header: float = 0.10
    self_instruct: float = 0.10
    multi_turn: float = 0.10
    roots: tuple[str, ...] = ROOTS
    turns: tuple[int, ...] = (2, 3)
    max_variants: int = 6
    instruct_pool: str = "wide"
    exclude_texts: frozenset[str] = field(default_factory=frozenset)  # normalized texts never to train on

    def __post_init__(self):
        _check_pool(self.instruct_pool)

    def shares(self) -> dict[str, float]:
        w = {k: getattr(self, k) for k in ("source", "instruct", "math", "header", "self_instruct", "multi_turn")}
        bad = {k: v for k, v in w.items() if not (isinstance(v, (int, float)) and v >= 0)}
        if bad or sum(w.values()) <= 0:
            raise ValueError(f"mix shares {bad or w} are invalid; allowed: numbers >= 0 with a positive sum")
        total = sum(w.values())
        return {k: v / total for k, v in w.items()}


def _counts(n: int, shares: dict[str, float]) -> dict[str, int]:
    """`n` split by `shares` (largest remainders, deterministic)."""
    raw = {k: n * s for k, s in shares.items()}
    counts = {k: int(v) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: (counts[k] - raw[k], k))[: n - sum(counts.values())]:
        counts[k] += 1
    return counts


def sample_mix(n: int, seed: int = 0, *, split: str = "train", config: MixConfig = MixConfig(),
               generate: Generate | None = None, sample: Generate | None = None) -> list[Prompt]:
    """About `n` distinct prompts of `split` in the shares of `config`, seeded.

    Templated families that run dry (instruct and header have a fixed number of pairs) repeat
    as sampled variants up to `config.max_variants` times, then leave their rest to the source
    prompts; self-instruct then makes several tries per seed (past its angles through
    `sample`, a sampling `Generate`, when given). Without `generate`, the self-instruct and
    multi-turn shares also go to the source prompts. Texts in `config.exclude_texts` (e.g. the frozen
    evaluation set, normalized) never come back.
    """
    _check_split(split)
    check_int("n", n, 0, error=ValueError)
    counts = _counts(n, config.shares())
    out: list[Prompt] = []
    for family in FAMILIES:
        out += family_prompts(family, split, counts[family], seed, variants=config.max_variants,
                              pool=config.instruct_pool)
    if generate is not None:
        seeds = family_prompts("instruct", split, max(counts["self_instruct"], counts["multi_turn"]), seed + 1,
                               pool=config.instruct_pool)
        want = counts["self_instruct"]
        new = []
        if want and seeds:
            per_seed = -(-want // len(seeds[:want]))  # several tries per seed when the pool is small
            new = self_instruct(generate, seeds[:want], per_seed=per_seed, seed=seed, sample=sample)[:want]
        starts = (seeds + new)[: counts["multi_turn"]]  # conversations open on templated and self-written requests
        out += new + build_conversations(generate, starts, turns=config.turns, seed=seed, split=split)
    out = [p for p in dedup(out) if normalize(p.text) not in config.exclude_texts]
    rest = n - len(out)
    if rest > 0:
        out = dedup(out + sample_prompts(rest, seed, split=split, roots=config.roots))
    return out[:n] if len(out) > n else out
