"""Request checks: can this prompt run with these sampling parameters on this decoder?

Owns `check_request`, the one place that decides whether a request is admissible, before
any work is done (no slot taken, no KV block reserved, no forward run). `config.py` owns
the checks of single fields (types and ranges that need no model); this module owns the
rules that need the model and the engine's capacities: token ids inside the vocabulary,
`top_k` at most the vocabulary, lengths inside `max_seq_len` and inside the model's own
context (`max_position_embeddings`), sampling only with a verifier that can sample.
Every failure is a `ConfigError` naming the value and the allowed range, prefixed with
"prompt {index}: " when the request is one of a batch. Knows nothing of engine state.
"""

from __future__ import annotations

import torch

from .config import ConfigError, SamplingParams

__all__ = ["DTYPES", "check_device", "check_dtype", "check_request", "model_context_length"]

DTYPES = ("float32", "bfloat16", "float16")  # parameter dtypes a target can be loaded in


def check_device(device) -> torch.device:
    """`device` (a `torch.device` or a string such as "cpu", "cuda", "cuda:1") if it exists here.

    Raises:
        ConfigError: not a device name, CUDA asked for without CUDA, or a CUDA index past the
            devices present.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device={device!r} is not a device; allowed: 'cpu', 'cuda', 'cuda:N'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} needs CUDA, which this machine (or this torch build) lacks; use 'cpu'")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"device={device!r} is out of range; allowed: cuda:0 .. cuda:{count - 1}")
    elif dev.type != "cpu":
        raise ConfigError(f"device={device!r} is not supported; allowed: 'cpu', 'cuda', 'cuda:N'")
    return dev


def check_dtype(dtype) -> torch.dtype:
    """`dtype` (a `torch.dtype` or its name, "bfloat16" / "torch.bfloat16") if a target can use it.

    Raises:
        ConfigError: naming the value and the allowed dtypes (`DTYPES`).
    """
    name = dtype if isinstance(dtype, str) else str(dtype)
    name = name.removeprefix("torch.")
    if not isinstance(dtype, (str, torch.dtype)) or name not in DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not allowed; allowed: {list(DTYPES)}")
    return getattr(torch, name)


def model_context_length(target) -> int | None:
    """The positions the target model was built for (`max_position_embeddings`), or None.

    Reads `target.config.max_position_embeddings` (a loaded `specdec.models.Target`), else
    `target.hf_config.max_position_embeddings` (a transformers config), else None (unknown:
    only `max_seq_len` bounds the request).
    """
    for holder in (getattr(target, "config", None), getattr(target, "hf_config", None)):
        value = getattr(holder, "max_position_embeddings", None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_request(
    prompt,
    params,
    *,
    vocab_size: int,
    max_seq_len: int,
    max_positions: int | None,
    lookahead: int,
    greedy_only: bool,
    index: int | None = None,
) -> None:
    """Raise `ConfigError` if `prompt` with `params` cannot run; touches no state.

    Args:
        prompt: the prompt's token ids, a list of ints (already encoded).
        params: its `SamplingParams`.
        vocab_size: V of the target; ids must lie in [0, V) and `top_k` in [0, V].
        max_seq_len: `SpecConfig.cache.max_seq_len`; prompt + `max_new_tokens` + `lookahead` must fit.
        max_positions: the model's own context (`model_context_length(target)`), or None;
            prompt + `max_new_tokens` must fit (positions drafted ahead are never committed).
        lookahead: positions past the committed length a step writes (the engine's
            `lookahead`: the tree's slots or the drafter's own rows, whichever is more).
        greedy_only: the verifier decodes greedily, so `temperature` must be 0.
        index: the prompt's index in its batch; prefixes every message with "prompt {index}: ".
    Raises:
        ConfigError: the first rule broken, naming the value and the allowed range.
    """
    where = "" if index is None else f"prompt {index}: "

    def fail(message: str):
        raise ConfigError(where + message)

    if not isinstance(params, SamplingParams):
        fail(f"sampling must be a SamplingParams, got {type(params).__name__}")
    if greedy_only and not params.greedy:
        fail(
            f"temperature={params.temperature} needs a sampling verifier; this verifier decodes greedily "
            "(use verifier='target-only' or 'speculative', or temperature=0)"
        )
    if params.top_k > vocab_size:
        fail(f"top_k={params.top_k} is out of range; allowed: [0, {vocab_size}] (the vocabulary; 0 = off)")
    bad_stops = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad_stops:
        fail(f"stop_token_ids {bad_stops[:5]} are out of range; allowed: [0, {vocab_size})")
    if not isinstance(prompt, (list, tuple)):
        fail(f"a prompt must be a list of token ids, got {type(prompt).__name__}")
    if len(prompt) == 0:
        fail("prompt is empty; a request needs at least one token")
    for pos, t in enumerate(prompt):
        if isinstance(t, bool) or not isinstance(t, int):
            fail(f"prompt token ids must be ints, got {t!r} ({type(t).__name__}) at position {pos}")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        fail(f"prompt token ids {bad[:5]} are out of range; allowed: [0, {vocab_size})")
    L, new = len(prompt), params.max_new_tokens
    need = L + new + lookahead
    if need > max_seq_len:
        fail(
            f"prompt of {L} tokens + max_new_tokens={new} + "
            f"{lookahead} positions drafted ahead = {need} exceeds max_seq_len={max_seq_len}"
        )
    if max_positions is not None and L + new > max_positions:
        fail(
            f"prompt of {L} tokens + max_new_tokens={new} = {L + new} exceeds the model's context "
            f"max_position_embeddings={max_positions}; shorten the prompt or lower max_new_tokens"
        )
