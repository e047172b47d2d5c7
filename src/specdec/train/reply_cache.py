"""The replies the target writes in the prompts stage, kept on disk so that the stage resumes.

The diverse mix's self-instruct requests and multi-turn conversations are written by the target
itself (`expand`): 12k of each took an H100 seven minutes, longer than a GPU call may safely
run. `cached_generate` wraps a `Generate` so that its replies go to a jsonl file chunk by
chunk as they are made, and so that a call past its deadline stops (`PromptsUnfinished`)
with every finished chunk kept: the next call asks the target only for what is missing and,
the replies being the same, rebuilds the same prompts (a conversation's next turn is keyed by
the replies before it).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from .expand import Generate, _generate

__all__ = ["PromptsUnfinished", "ReplyCache", "cached_generate"]


class PromptsUnfinished(RuntimeError):
    """The prompts stage met its deadline; the replies written so far are in the cache."""


class ReplyCache:
    """Replies by key (a hash of the generator's label and the conversation), appended to a
    jsonl file (one ``{"key", "reply"}`` per line) as they come; a torn last line (a killed
    call) is skipped when read."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.replies: dict[str, str] = {}
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the last line of a killed call
                self.replies[row["key"]] = row["reply"]

    def __len__(self) -> int:
        return len(self.replies)

    @staticmethod
    def key(label: str, conversation: list[dict]) -> str:
        return hashlib.sha256(json.dumps([label, conversation], sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def add(self, items: list[tuple[str, str]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps({"key": k, "reply": r}, ensure_ascii=False) + "\n" for k, r in items))
            f.flush()
        self.replies.update(items)


def cached_generate(generate: Generate, cache: ReplyCache, label: str, *, chunk: int, deadline: float | None = None,
                    clock: Callable[[], float] = time.perf_counter) -> Generate:
    """`generate` behind `cache`: conversations already answered (under `label`, which names the
    generator: greedy or sampled, its settings) come from the cache; the rest are generated
    `chunk` at a time, each chunk saved before the next starts. Before each chunk, past
    `deadline` (a `clock` time), raises `PromptsUnfinished`."""
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1")

    def run(convs: list[list[dict]]) -> list[str]:
        keys = [cache.key(label, c) for c in convs]
        missing, seen = [], set()  # first index of each conversation not answered yet
        for i, k in enumerate(keys):
            if k not in cache.replies and k not in seen:
                seen.add(k)
                missing.append(i)
        for start in range(0, len(missing), chunk):
            if deadline is not None and clock() >= deadline:
                raise PromptsUnfinished(f"{len(missing) - start} of {len(convs)} replies of a {label!r} round not written yet "
                                        f"({len(cache)} in {cache.path})")
            part = missing[start:start + chunk]
            replies = _generate(generate, [convs[i] for i in part])  # one str per conversation, checked
            cache.add([(keys[i], r) for i, r in zip(part, replies)])
        return [cache.replies[k] for k in keys]

    return run
