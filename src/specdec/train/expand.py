"""Prompts the target writes itself: self-instruct requests and multi-turn conversations.

Owns the two expansions of the templated seeds of `mix`, both driven by a `Generate` callable
(a batch of conversations, each a list of ``{"role", "content"}`` messages -> the assistant's
replies), so they run with a fake callable in tests and with the real target on a GPU
(`target_generate`):

- `self_instruct`: the target is shown a seed request and writes a new one on the same subject;
  the new prompt keeps the seed's kind and source (so its split is the seed's split);
- `build_conversations`: the target answers a seed request, a follow-up is asked (from
  `FOLLOW_UPS`, or written by the target), it answers again ..., until 2-3 user turns; the
  prompt (kind ``multi-turn``) is the conversation up to its last user turn, whose answer the
  distillation (or the evaluation) generates. A conversation is held out iff its seed or one
  of its follow-ups is held out (`HELDOUT_FOLLOW_UPS`).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable

from .conversation import MULTI_TURN, encode_messages, messages_prompt
from .prompts import Prompt, dedup, normalize

__all__ = ["FOLLOW_UPS", "HELDOUT_FOLLOW_UPS", "Generate", "build_conversations", "clean_instruction", "self_instruct",
           "target_generate"]

Generate = Callable[[list[list[dict]]], list[str]]

FOLLOW_UPS: dict[str, str] = {
    "example": "Can you give me a concrete example?",
    "simpler": "Can you explain that more simply?",
    "shorter": "Please make that shorter.",
    "why": "Why is that?",
    "more": "Tell me more about the most important point.",
    "list": "Can you put that as a numbered list?",
    "mistake": "What is a common mistake people make here?",
    "next": "What should I do next?",
    "summary": "Summarize our conversation in two sentences.",
    "opposite": "What would someone who disagrees say?",
}
HELDOUT_FOLLOW_UPS = frozenset({"summary", "opposite", "mistake"})
SELF_FOLLOW_UP = "self"  # the follow-up id when the target wrote it

INSTRUCT_META = ("Here is a request that a user sent to an AI assistant:\n\n{seed}\n\nWrite one new, different request "
                 "on a related subject that a user might send.{angle} Reply with the request only.")
ANGLES = ("", " Make it more specific.", " Make it a practical how-to question.", " Make it a request for a creative text.",
          " Make it a question a beginner would ask.", " Make it about a different aspect of the subject.")  # try k: angle k
FOLLOW_UP_META = ("Here is a conversation between a user and an assistant:\n\n{history}\n\nWrite the user's next short "
                  "follow-up question. Reply with the question only.")
MIN_INSTRUCTION_CHARS, MAX_INSTRUCTION_CHARS = 12, 300
_LABEL = re.compile(r"^\s*(?:\d+[.)]\s*|[-*]\s+|(?:new |follow-up )?(?:request|question|user)\s*:\s*)", re.I)


def clean_instruction(text: str) -> str | None:
    """The first usable line of a generated request (labels, numbering, quotes stripped), or None
    when it is too short or too long (`MIN_INSTRUCTION_CHARS`..`MAX_INSTRUCTION_CHARS`)."""
    for line in text.strip().splitlines():
        for _ in range(3):  # "2) New request: ..." has two labels
            line = _LABEL.sub("", line)
        line = line.strip().strip("\"'`“”").strip()
        if line:
            return line if MIN_INSTRUCTION_CHARS <= len(line) <= MAX_INSTRUCTION_CHARS else None
    return None


def _generate(generate: Generate, convs: list[list[dict]]) -> list[str]:
    replies = list(generate(convs)) if convs else []
    if len(replies) != len(convs) or not all(isinstance(r, str) for r in replies):
        raise ValueError(f"generate returned {len(replies)} replies for {len(convs)} conversations; it must return one str each")
    return replies


def self_instruct(generate: Generate, seeds: list[Prompt], *, per_seed: int = 1, seed: int = 0,
                  sample: Generate | None = None) -> list[Prompt]:
    """New requests the target writes from `seeds` (chat prompts), `per_seed` tries each (try k
    asks for a different angle, `ANGLES`, so greedy tries differ).

    Tries past the last angle would repeat a greedy reply: they go to `sample` (a `Generate`
    that samples) when given, and are not made otherwise. Replies that `clean_instruction`
    rejects or that repeat a seed or an earlier reply are dropped. A new prompt keeps its seed's
    kind and source plus ``|self``, so `mix.split_of` gives it the seed's split: expanding
    training seeds never yields held-out kinds.
    """
    if per_seed < 1:
        raise ValueError(f"per_seed={per_seed} must be >= 1")
    bad = [p.kind for p in seeds if not p.chat]
    if bad:
        raise ValueError(f"self_instruct needs chat seeds; got kinds {sorted(set(bad))} with chat=False")
    tries = per_seed if sample is not None else min(per_seed, len(ANGLES))
    order = [(p, k) for p in seeds for k in range(tries)]
    random.Random(f"specdec-self-instruct:{seed}").shuffle(order)
    convs = [[{"role": "user", "content": INSTRUCT_META.format(seed=p.text, angle=ANGLES[k % len(ANGLES)])}]
             for p, k in order]
    greedy = [i for i, (_, k) in enumerate(order) if k < len(ANGLES)]
    sampled = [i for i, (_, k) in enumerate(order) if k >= len(ANGLES)]
    replies = dict(zip(greedy, _generate(generate, [convs[i] for i in greedy])))
    if sampled:
        replies.update(zip(sampled, _generate(sample, [convs[i] for i in sampled])))
    known = {normalize(p.text) for p in seeds}
    out = []
    for i, (p, _) in enumerate(order):
        text = clean_instruction(replies[i])
        if text is not None and normalize(text) not in known:
            out.append(Prompt(p.kind, p.source + "|self", text, True))
    return dedup(out)


def _history(messages: list[dict]) -> str:
    return "\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)


def _follow_up_ids(split: str) -> list[str]:
    return sorted(k for k in FOLLOW_UPS if split == "heldout" or k not in HELDOUT_FOLLOW_UPS)


def build_conversations(generate: Generate, seeds: list[Prompt], *, turns: tuple[int, ...] = (2, 3), seed: int = 0,
                        split: str = "train", self_follow_up: float = 0.0) -> list[Prompt]:
    """Multi-turn prompts from chat `seeds`: the target answers, a follow-up is asked, ... until
    each conversation has its number of user turns (drawn from `turns`), ending on a user turn.

    Follow-ups of a training conversation come from the training `FOLLOW_UPS` only; those of a
    held-out one from all of them, at least one held out. With `self_follow_up` > 0 that share
    of the follow-ups is written by the target (a short question; the template one is used
    when its reply is unusable). The replies are batched per round: one `generate` call per
    turn for all conversations.
    """
    if not turns or any(not isinstance(t, int) or t < 2 for t in turns):
        raise ValueError(f"turns={turns!r} must be user-turn counts >= 2")
    if split not in ("train", "heldout"):
        raise ValueError(f"split={split!r} is unknown; allowed: ['train', 'heldout']")
    if not 0.0 <= self_follow_up <= 1.0:
        raise ValueError(f"self_follow_up={self_follow_up} is out of range; allowed: [0, 1]")
    if any(not p.chat or p.kind == MULTI_TURN for p in seeds):
        raise ValueError("build_conversations needs single-turn chat seeds")
    rng = random.Random(f"specdec-multi-turn:{seed}:{split}")
    ids = _follow_up_ids(split)
    held = sorted(HELDOUT_FOLLOW_UPS)
    convs = [[{"role": "user", "content": p.text}] for p in seeds]
    want = [rng.choice(turns) for _ in seeds]
    plans = []
    for w in want:  # the follow-up ids of each conversation, fixed up front (reproducible)
        plan = [rng.choice(ids) for _ in range(w - 1)]
        if split == "heldout" and not set(plan) & HELDOUT_FOLLOW_UPS:
            plan[rng.randrange(len(plan))] = rng.choice(held)
        plans.append(plan)
    used: list[list[str]] = [[] for _ in seeds]
    for r in range(max(want, default=1) - 1):
        live = [i for i, w in enumerate(want) if w - 1 > r]
        for i, reply in zip(live, _generate(generate, [convs[i] for i in live])):
            convs[i].append({"role": "assistant", "content": reply.strip()})
        own = [i for i in live if rng.random() < self_follow_up]
        written = dict(zip(own, _generate(generate, [[{"role": "user", "content": FOLLOW_UP_META.format(history=_history(convs[i]))}]
                                                     for i in own])))
        for i in live:
            text = clean_instruction(written[i]) if i in written else None
            fid = SELF_FOLLOW_UP if text else plans[i][r]
            convs[i].append({"role": "user", "content": text or FOLLOW_UPS[fid]})
            used[i].append(fid)
    return [messages_prompt(c, p.source + "".join(f"|mt:{f}" for f in u)) for p, c, u in zip(seeds, convs, used)]


def target_generate(target, *, max_new_tokens: int = 128, batch_size: int = 64, temperature: float = 0.0, seed: int = 0,
                    cuda_graph: bool = False, progress: bool = False) -> Generate:
    """A `Generate` backed by `target` (its chat template, `distill.generate_responses`; greedy by default).
    Call k samples with seed ``seed + k``: a stage that generates in several calls (rounds, the
    chunks of `reply_cache.cached_generate`) does not draw the same noise in each."""
    from .distill import generate_responses  # here, not at the top: distill imports torch, the prompt tools need none

    tok = target.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise ValueError("target_generate needs a target whose tokenizer has a chat template")

    calls = itertools.count()

    def generate(convs: list[list[dict]]) -> list[str]:
        ids = [encode_messages(c, tok) for c in convs]
        out = generate_responses(target.model, ids, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                 eos_token_ids=tuple(target.info.eos_token_ids), temperature=temperature,
                                 seed=seed + next(calls),
                                 progress=progress, cuda_graph=cuda_graph)
        return [tok.decode(r or [], skip_special_tokens=True) for r in out]

    return generate
