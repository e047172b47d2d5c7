"""A finished request's slot beside running ones, through the Triton paged-attention kernel.

The twenty-second session's H100 crash (`notes/gpu/issue21/crash/CRASH.md`): a finished request's
slot keeps its committed length while its KV blocks are freed, every step still runs attention over
all B rows, and the kernel scanned the idle row's committed keys through its maskless tiles, reading
rows before the cache. The CPU suites run attention on the reference, which reads freed blocks as 0,
so nothing there could see it. Here the target runs the Triton kernel (interpreted, its asserts on:
a maskless tile must read allocated blocks only) in a batch where one request ends first; outputs must
still equal transformers' greedy ones.
"""

import pytest
import torch

from _kernel_asserts import interpreter_asserts
from _mtp_heads import hf_greedy
from specdec import SamplingParams, SpecConfig, load_target
from specdec.entrypoints.decoder import SpecDecoder

PROMPT_LENS = (70, 66, 74)  # > 64 committed keys: whole 32- and 64-key maskless tiles
NEW_TOKENS = (2, 10, 10)  # the first request ends after its first step; its slot stays idle after


@pytest.mark.parametrize("drafter, shape", [("none", {}), ("ngram", dict(tree="linear", max_draft_len=3))],
                         ids=["target-only", "ngram-chain"])
def test_a_finished_slot_beside_running_ones_reads_no_freed_block(tiny_llama3_with_hf, drafter, shape):
    folder, hf = tiny_llama3_with_hf
    target = load_target(folder, attn_impl="triton")
    config = SpecConfig(drafter=drafter, max_batch_size=len(PROMPT_LENS), max_seq_len=128, **shape)
    dec = SpecDecoder.from_pretrained(target, None, config)
    gen = torch.Generator().manual_seed(5)
    vocab = hf.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in NEW_TOKENS]
    with interpreter_asserts():
        outs = dec.generate(prompts, params)
    for prompt, out, n in zip(prompts, outs, NEW_TOKENS):
        assert out.stats.finish_reason == "length", out.stats.error
        assert out.token_ids == hf_greedy(hf, prompt, n)
