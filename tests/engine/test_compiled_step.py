"""The compiled step: torch.compile'd pieces give the eager tokens, nothing recompiles after
`warmup()`, chunked prefill, the draft KV on the target's allocator, counter-based seeds;
on CUDA also: CUDA graphs give the eager tokens, one host sync per step, no re-capture.

Tiny random Llama targets (CPU, fp32), random EAGLE-3 / MTP heads, an oracle MTP head on a
bigram target (so long paths are accepted and relocated), n-gram drafting (a host drafter),
and target-only. Every comparison is token for token.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder

from _mtp_heads import bigram_oracle_mtp, e2e_cpu, random_mtp  # noqa: F401

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
PROMPTS = [[5, 17, 33], [9] * 11 + [40, 2], [71], [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43], [60, 61]]
LENGTHS = [24, 9, 17, 30, 5]  # requests end at different steps; two calls reuse slots
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.usefixtures("e2e_cpu"),
    pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning"),
]


BASE = dict(max_batch_size=3, max_seq_len=96, kv_block_size=4)
SETUPS = {  # name -> (target fixture, head, config)
    "target-only": ("tiny_llama8", None, dict(drafter="none")),
    "eagle3-chain": ("tiny_llama8", "eagle3", dict(drafter="eagle3", max_draft_len=3)),
    "eagle3-tree": ("tiny_llama8", "eagle3", dict(drafter="eagle3", tree="dynamic", topk=3, max_draft_len=3, max_total_draft_tokens=7)),
    "eagle3-2layers-tree": ("tiny_llama8", "eagle3-2layers",
                            dict(drafter="eagle3", tree="dynamic", topk=3, max_draft_len=3, max_total_draft_tokens=7)),
    "mtp-oracle-chain": ("bigram_llama", "mtp-oracle", dict(drafter="mtp", max_draft_len=4)),
    "mtp-oracle-tree": ("bigram_llama", "mtp-oracle", dict(drafter="mtp", tree="dynamic", topk=2, max_draft_len=3)),
    "mtp-random-tree": ("tiny_llama8", "mtp", dict(drafter="mtp", tree="dynamic", topk=3, max_draft_len=3, max_total_draft_tokens=7)),
    "ngram-tree": ("bigram_llama", None, dict(drafter="ngram", tree="dynamic", topk=2, max_draft_len=4)),
    "eagle3-speculative": ("tiny_llama8", "eagle3", dict(drafter="eagle3", max_draft_len=3, verifier="speculative")),
}


def decoder(request, name: str, **knobs) -> SpecDecoder:
    target_name, head, cfg = SETUPS[name]
    target = specdec.load_target(request.getfixturevalue(target_name), device=DEVICE)
    draft = {"eagle3": request.getfixturevalue("tiny_eagle3_head") if head == "eagle3" else None,
             "eagle3-2layers": request.getfixturevalue("tiny_eagle3_head_two_layers") if head == "eagle3-2layers" else None,
             "mtp": random_mtp(seed=0), "mtp-oracle": bigram_oracle_mtp(), None: None}[head]
    return SpecDecoder.from_pretrained(target, draft, SpecConfig(**{**BASE, **cfg, **knobs}))


def run(dec: SpecDecoder, prompts=PROMPTS, lengths=LENGTHS, **params) -> list[list[int]]:
    out = []
    B = dec.config.cache.max_batch_size
    for i in range(0, len(prompts), B):
        batch = [SamplingParams(max_new_tokens=n, ignore_eos=True, **params) for n in lengths[i : i + B]]
        out += [r.token_ids for r in dec.generate(prompts[i : i + B], batch)]
    return out


@pytest.mark.parametrize("name", [n for n in SETUPS if n != "eagle3-speculative"])
def test_compiled_pieces_give_the_eager_tokens(request, name):
    eager = run(decoder(request, name, compile=False, cuda_graphs=False))
    dec = decoder(request, name, compile=True, cuda_graphs=False)
    assert dec.compiled and not dec.cuda_graphs
    assert run(dec) == eager


_FRESH_PROCESS = r"""
import sys, torch
sys.path.insert(0, {tests!r})
import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder
from specdec.drafters.eagle3_checkpoint import load_eagle3
target = specdec.load_target({llama!r}, device={device!r})
config = SpecConfig(drafter="eagle3", tree="dynamic", topk=3, max_draft_len=3, max_total_draft_tokens=7,
                    max_batch_size=3, max_seq_len=96, kv_block_size=4, compile=True, cuda_graphs={graphs})
dec = SpecDecoder.from_pretrained(target, {head!r}, config)
report = dec.warmup(progress=False)
assert report.buckets == (1, 2, 3), report
# prompt lengths equal to the model's head counts (4 query, 2 KV heads) and head_dim (16)
lengths = [1, 2, 3, 4, 5, 16, 7, 13, 2]
gen = torch.Generator().manual_seed(0)
with torch._dynamo.config.patch(error_on_recompile=True):
    for i in range(0, len(lengths), 3):
        prompts = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in lengths[i:i + 3]]
        dec.generate(prompts, [SamplingParams(max_new_tokens=m, ignore_eos=True) for m in (6, 20, 11)][:len(prompts)])
    dec.generate([[7]], SamplingParams(max_new_tokens=9, ignore_eos=True))  # bucket 1 after bucket 3
print("NO-RECOMPILE-OK", report.seconds)
"""


def test_nothing_recompiles_after_warmup(request, tmp_path):
    """In a fresh process (compiled graphs of earlier tests must not help): warmup(), then
    prompts of many lengths and batch sizes under `error_on_recompile`."""
    import subprocess
    import sys
    from pathlib import Path

    script = _FRESH_PROCESS.format(
        tests=str(Path(__file__).parents[1]), llama=str(request.getfixturevalue("tiny_llama8")),
        head=str(request.getfixturevalue("tiny_eagle3_head")), device=DEVICE, graphs=CUDA,
    )
    env = {**__import__("os").environ, "TRITON_INTERPRET": "0"} if not CUDA else None
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0 and "NO-RECOMPILE-OK" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("name", ["eagle3-chain", "mtp-oracle-tree", "ngram-tree"])
def test_chunked_prefill_gives_the_unchunked_tokens(request, name):
    whole = run(decoder(request, name))
    assert run(decoder(request, name, prefill_chunk_size=4)) == whole
    assert run(decoder(request, name, prefill_chunk_size=1)) == whole


def test_the_draft_kv_lives_on_the_target_allocator(request):
    dec = decoder(request, "eagle3-tree")
    drafter, cache = dec.strategies.drafter, dec.engine.runner.cache
    assert drafter.cache.allocator is cache.allocator and drafter.cache.block_tables is cache.block_tables
    assert drafter.cache.num_layers == 1 and cache.num_layers == 8
    blocks = cache.num_blocks
    res = dec.generate(PROMPTS[:3], SamplingParams(max_new_tokens=12, ignore_eos=True))
    assert [len(r.token_ids) for r in res] == [12] * 3
    assert cache.num_free_blocks == blocks  # every block (target and draft KV) came back


@pytest.mark.parametrize("name", ["target-only", "eagle3-tree", "eagle3-speculative"])
def test_a_seeded_request_samples_the_same_tokens_alone_and_in_a_batch(request, name):
    if name != "eagle3-speculative":
        knobs = dict(verifier="target-only")
    else:
        knobs = {}
    dec = decoder(request, name, **knobs)
    params = dict(temperature=1.0, top_k=20)
    alone = dec.generate([PROMPTS[1]], SamplingParams(max_new_tokens=16, seed=7, **params))[0].token_ids
    batch = dec.generate(
        [PROMPTS[0], PROMPTS[2], PROMPTS[1]],
        [SamplingParams(max_new_tokens=n, seed=s, **params) for n, s in ((9, 1), (20, 2), (16, 7))],
    )
    assert batch[2].token_ids == alone  # slot 2 instead of slot 0, other requests beside it
    other = dec.generate([PROMPTS[1]], SamplingParams(max_new_tokens=16, seed=8, **params))[0].token_ids
    assert other != alone


def test_cuda_graphs_need_cuda():
    if CUDA:
        pytest.skip("this machine has CUDA; the refusal is for CPU targets")
    with pytest.raises(specdec.ConfigError, match=r"cuda_graphs=True needs a CUDA target"):
        SpecDecoder(_tiny_target(), SpecConfig(**BASE, cuda_graphs=True))


def _tiny_target():
    from specdec.models import DecoderLM, ModelConfig, RopeConfig
    from specdec.models.loader import Target
    from specdec.strategies import TargetInfo

    cfg = ModelConfig(model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=8, rms_norm_eps=1e-5, rope=RopeConfig(),
                      max_position_embeddings=128)
    model = DecoderLM(cfg).eval()
    return Target(model, TargetInfo(2, 16, 32), None, None, cfg, None)


# ---------------------------------------------------------------------------------- CUDA only
cuda_only = pytest.mark.skipif(not CUDA, reason="CUDA graphs and host-sync checks need a CUDA device")


@cuda_only
@pytest.mark.parametrize("name", list(SETUPS))
def test_cuda_graphs_give_the_eager_tokens(request, name):
    eager = run(decoder(request, name, compile=False, cuda_graphs=False))
    dec = decoder(request, name, compile=True, cuda_graphs=True)
    dec.warmup(progress=False)
    assert run(dec) == eager
    assert dec.engine.capture_count == len(dec.config.batch_buckets)


@cuda_only
@pytest.mark.parametrize("name", ["target-only", "eagle3-tree", "mtp-oracle-chain", "ngram-tree"])
def test_prefill_graphs_give_the_eager_tokens(request, name):
    """Prompts one at a time (each prefill a one-row bucket) and three at a time (a grouped
    prefill, a 3-row bucket), every chunk from position 0: replayed (rows, length) graphs of
    the target's forward and, for model heads, of the head's ingest."""
    eager_dec = decoder(request, name, compile=False, cuda_graphs=False)
    alone = [run(eager_dec, [p], [n])[0] for p, n in zip(PROMPTS, LENGTHS)]
    together = run(eager_dec)
    dec = decoder(request, name, compile=True, cuda_graphs=True)
    report = dec.warmup(progress=False)
    parts = [p for p in (dec.engine.runner, dec.strategies.drafter) if hasattr(p, "use_prefill_buckets")]
    assert report.prefill_graphs == sum(len(p.prefill_buckets.keys) for p in parts) > 0
    assert all(len(p.prefill_buckets.graphs) == len(p.prefill_buckets.keys) for p in parts)
    replayed = []
    for part in parts:
        buckets, log = part.prefill_buckets, []
        buckets.run = lambda key, run=buckets.run, log=log: (log.append(key), run(key))[1]
        replayed.append(log)
    assert [run(dec, [p], [n])[0] for p, n in zip(PROMPTS, LENGTHS)] == alone
    assert run(dec) == together
    for log in replayed:  # every prompt fits 16 tokens; batch 3 prefills 3 then 2 together
        assert log == [(1, 16)] * len(PROMPTS) + [(3, 16), (2, 16)], log


@cuda_only
@pytest.mark.parametrize("name", ["target-only", "eagle3-tree", "mtp-oracle-chain", "ngram-tree"])
def test_the_device_part_of_a_step_never_syncs_with_the_host(request, name):
    dec = decoder(request, name, compile=True, cuda_graphs=True)
    dec.warmup(progress=False)
    dec.engine.check_syncs = True  # torch.cuda.set_sync_debug_mode("error") around each launch
    run(dec)
    eager = decoder(request, name, compile=False, cuda_graphs=False)
    eager.engine.check_syncs = True
    run(eager)


@cuda_only
def test_a_thousand_tokens_after_warmup_capture_and_compile_nothing_new(request):
    dec = decoder(request, "eagle3-tree", compile=True, cuda_graphs=True, max_seq_len=160)
    dec.warmup(progress=False)
    captured = dec.engine.capture_count
    gen = torch.Generator().manual_seed(0)
    total = 0
    with torch._dynamo.config.patch(error_on_recompile=True):
        while total < 1000:
            lengths = torch.randint(1, 60, (3,), generator=gen).tolist()
            prompts = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in lengths]
            total += sum(len(t) for t in run(dec, prompts, [40, 25, 33]))
    assert dec.engine.capture_count == captured


@cuda_only
@pytest.mark.parametrize("name", ["eagle3-chain", "eagle3-tree", "mtp-oracle-chain"])
def test_adaptive_steps_in_cuda_graphs_give_the_eager_tokens(request, name):
    """Adaptive: four captured variants per bucket (speculative, plain, deferred plain, and
    the bare plain step while no running request drafts), switched by a seeded coin so every
    variant follows every other; requests admitted with and without their drafter in a set
    pattern (the first batch ends with one undrafted request running alone, the second has no
    drafter at all: bare steps); tokens equal the eager (fixed) decoder's and no step syncs
    with the host."""
    import itertools
    import random

    from specdec.engine.adaptive import BARE, DEFERRED, PLAIN, SPECULATIVE

    eager = run(decoder(request, name, compile=False, cuda_graphs=False))
    dec = decoder(request, name, compile=True, cuda_graphs=True, adaptive=True)
    dec.warmup(progress=False)
    # one graph per (bucket, variant): the variants an adaptive head engine has (test_adaptive.py
    # checks that set on the CPU; a hard-coded count here went stale when the bare step came)
    assert dec.engine.capture_count == len(dec.engine.steps) * len(dec.config.batch_buckets)
    assert sorted(dec.engine.steps) == [BARE, DEFERRED, PLAIN, SPECULATIVE]
    rule = dec.engine.adaptive_rule
    coin, drafts, due = random.Random(3), itertools.cycle([False, False, True, False, False]), []
    rule.admit_with_drafter = lambda budget, batch=None: next(drafts)
    rule.choose = lambda bucket, running, plain: due.append(plain) or coin.random() < 0.4
    dec.engine.check_syncs = True
    assert run(dec) == eager
    assert BARE in due and len(set(due)) >= 2, due


@pytest.mark.parametrize("name", ["target-only", "eagle3-chain"])
def test_the_whole_step_compiled_gives_the_eager_tokens_and_never_recompiles(request, name):
    """`compile="step"`: the whole step function (draft, tree, verify forward, verification,
    relocation, advance) is one torch.compile graph per bucket (fullgraph: a graph break
    fails), compiled at warmup() and never again; with graphs on CUDA it is captured too.
    One bucket (the whole-step compile takes ~1 min per graph on a 2-core CPU)."""
    knobs = dict(max_batch_size=2, graph_batch_sizes=(2,))
    prompts, lengths = PROMPTS[:4], LENGTHS[:4]
    eager = run(decoder(request, name, compile=False, cuda_graphs=False, **knobs), prompts, lengths)
    dec = decoder(request, name, compile="step", cuda_graphs=CUDA, **knobs)
    assert dec.compile_step
    dec.warmup(progress=False)
    assert sorted(dec.engine._compiled_steps) == [(2, "speculative")]
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert run(dec, prompts, lengths) == eager
