"""Chat: a conversation (a list of ``{"role", "content"}`` messages) to prompt token ids.

Owns recognising a conversation among prompts (`is_conversation`), checking its messages
(`check_conversation`) and applying the target tokenizer's chat template
(`encode_conversation`), always with the generation prompt, so an instruct model answers
instead of continuing the text. Plain strings stay completions; that choice is the
caller's (`SpecDecoder.generate` / `chat`). Every problem is a `ConfigError` naming the
conversation's index (in a batch), the message and the field. Knows nothing of models.
"""

from __future__ import annotations

from ..errors import ConfigError

__all__ = ["check_conversation", "encode_conversation", "has_chat_template", "is_conversation"]


def is_conversation(prompt) -> bool:
    """A non-empty list or tuple whose items are all dicts (messages)."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(isinstance(m, dict) for m in prompt)


def has_chat_template(tokenizer) -> bool:
    """The tokenizer carries a chat template (a string, or a dict of named templates)."""
    return bool(getattr(tokenizer, "chat_template", None))


def check_conversation(messages, *, index: int | None = None) -> list[dict]:
    """The messages as a list, each a dict with a non-empty string ``role`` and a string
    ``content`` (other keys are passed to the template as they are).

    Raises:
        ConfigError: not a non-empty list of dicts, or a message without a valid role / content;
            prefixed with "prompt {index}: " when `index` is given (its place in the batch).
    """
    where = "" if index is None else f"prompt {index}: "
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ConfigError(f"{where}a conversation must be a non-empty list of {{'role', 'content'}} dicts, got {messages!r}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ConfigError(f"{where}message {i} must be a dict with 'role' and 'content', got {message!r}")
        missing = [k for k in ("role", "content") if k not in message]
        if missing:
            raise ConfigError(f"{where}message {i} has no {' or '.join(repr(k) for k in missing)}: {message!r}")
        role, content = message["role"], message["content"]
        if not isinstance(role, str) or not role:
            raise ConfigError(f"{where}message {i}: 'role' must be a non-empty string such as 'user', got {role!r}")
        if not isinstance(content, str):
            raise ConfigError(
                f"{where}message {i}: 'content' must be a string, got {content!r} ({type(content).__name__})"
            )
    return list(messages)


def encode_conversation(tokenizer, messages, *, index: int | None = None) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template, ending with the
    assistant's generation prompt (the template's own special tokens, no extra BOS).

    Raises:
        ConfigError: no tokenizer, no chat template, a malformed message, or a template that
            refuses the conversation (e.g. roles that do not alternate), naming which.
    """
    where = "" if index is None else f"prompt {index}: "
    messages = check_conversation(messages, index=index)
    if tokenizer is None:
        raise ConfigError(f"{where}a conversation needs a target with a tokenizer; pass token-id lists")
    if not has_chat_template(tokenizer):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ConfigError(
            f"{where}the target's tokenizer ({name}) has no chat template; pass plain strings for completions "
            "(or set tokenizer.chat_template)"
        )
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # jinja2 TemplateError raised by the template itself (`raise_exception`)
        raise ConfigError(f"{where}the chat template refused this conversation: {e}") from None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
