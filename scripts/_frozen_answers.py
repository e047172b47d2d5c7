"""SmolLM2's own greedy answers to the per-category frozen prompts (transformers, float32, CPU):
what `target_predictability.py` and `head_ranking.py` read, one prompt at a time."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.models.gguf import convert_gguf, smollm2_gguf_path
from specdec.train.categories import category_of, frozen_category_prompts
from specdec.train.evaluate import encode_any


def load_smollm2_hf():
    """(tokenizer, float32 transformers model in eval mode) of the SmolLM2 GGUF."""
    folder = convert_gguf(smollm2_gguf_path())
    return AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def greedy_answers(model, tok, per_category: int, new_tokens: int,
                   categories: set[str] | None = None) -> Iterator[tuple[str, int, torch.Tensor]]:
    """(category, prompt tokens, [1, T] prompt + greedy answer) per frozen prompt of `categories`
    (None: all); a prompt whose answer would not fit the target's context is skipped, as the
    evaluation skips it."""
    for prompt in frozen_category_prompts(per_category):
        c = category_of(prompt)
        if categories is not None and c not in categories:
            continue
        ids = encode_any(prompt, tok, model.config.vocab_size)
        if len(ids) + new_tokens > model.config.max_position_embeddings:
            continue
        with torch.no_grad():
            seq = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)
        yield c, len(ids), seq
