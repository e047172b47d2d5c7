"""Test helper: a tiny word-level tokenizer with a ChatML-style chat template, saved beside a
tiny checkpoint so `load_target` gives a target that can chat (no download, no SmolLM2).

Not a test module (leading underscore). Ids: 0 <unk>, 1 <|im_start|>, 2 <|im_end|> (EOS),
3 user, 4 assistant, 5 system, then words "w0", "w1", ... up to the vocabulary size.
"""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
STRICT = (  # a template that refuses a conversation, as real ones do (roles must alternate)
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_tokenizer(vocab_size: int = 96, template: str | None = CHATML):
    """A `PreTrainedTokenizerFast` over `vocab_size` ids with `template` as its chat template (None = none)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system"]
    words += [f"w{i}" for i in range(vocab_size - len(words))]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.decoder = decoders.WordPiece()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="<unk>", eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>"]
    )
    if template is not None:
        tok.chat_template = template
    return tok


def save_chat_tokenizer(folder: Path, vocab_size: int = 96, template: str | None = CHATML):
    tok = chat_tokenizer(vocab_size, template)
    tok.save_pretrained(str(folder))
    return tok
