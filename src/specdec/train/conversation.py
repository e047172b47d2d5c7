"""Prompts that are whole conversations (kind ``multi-turn``): storing, encoding, distilling.

A `Prompt` holds one user message; a multi-turn prompt keeps its messages (user, assistant,
..., user) as JSON in `Prompt.text`, so it travels in the same jsonl files. `encode_any`
encodes every prompt kind (multi-turn through the chat template with all its messages, the
rest as `prompts.encode_prompt`); `build_mix_distill_data` is `distill.build_distill_data`
with that encoder, for training data that holds conversations.
"""

from __future__ import annotations

import json

from .prompts import Prompt, encode_prompt

__all__ = ["MULTI_TURN", "build_mix_distill_data", "encode_any", "encode_messages", "messages_prompt", "prompt_messages"]

MULTI_TURN = "multi-turn"
ROLES = ("user", "assistant")


def _check_messages(messages: list[dict]) -> None:
    if not messages or messages[-1].get("role") != "user":
        raise ValueError("a multi-turn prompt must be a non-empty message list ending with a user message")
    for i, m in enumerate(messages):
        want = ROLES[i % 2]
        if m.get("role") != want or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} is {m!r}; allowed: {{'role': {want!r}, 'content': str}} (user and assistant alternate)")


def messages_prompt(messages: list[dict], source: str) -> Prompt:
    """A multi-turn `Prompt` from alternating user/assistant messages ending with a user one."""
    _check_messages(messages)
    clean = [{"role": m["role"], "content": m["content"]} for m in messages]
    return Prompt(MULTI_TURN, source, json.dumps(clean, ensure_ascii=False), True)


def prompt_messages(prompt: Prompt) -> list[dict]:
    """The messages of `prompt`: the stored conversation (multi-turn) or one user message."""
    if prompt.kind != MULTI_TURN:
        return [{"role": "user", "content": prompt.text}]
    messages = json.loads(prompt.text)
    _check_messages(messages)
    return messages


def encode_messages(messages: list[dict], tokenizer) -> list[int]:
    """Token ids of a conversation through the tokenizer's chat template (generation prompt added)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_any(prompt: Prompt, tokenizer, vocab_size: int | None = None) -> list[int]:
    """`encode_prompt` for every kind: a multi-turn prompt is encoded with all its messages.

    Without a tokenizer (tiny test targets) a conversation is its contents joined by newlines,
    as UTF-8 bytes modulo `vocab_size`.
    """
    if prompt.kind != MULTI_TURN:
        return encode_prompt(prompt, tokenizer, vocab_size)
    messages = prompt_messages(prompt)
    if tokenizer is None:
        flat = Prompt(prompt.kind, prompt.source, "\n".join(m["content"] for m in messages), False)
        return encode_prompt(flat, None, vocab_size)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("a multi-turn prompt needs a tokenizer with a chat template")
    return encode_messages(messages, tokenizer)


def build_mix_distill_data(target, prompts: list[Prompt], **kw):
    """`distill.build_distill_data` for prompts of any kind (multi-turn included): the same
    keyword arguments, `DistillData` and meta keys, with `encode_any` as the encoder."""
    from .distill import build_distill_data  # here, not at the top: distill imports torch, the prompt tools need none

    return build_distill_data(target, prompts, encode=encode_any, **kw)
