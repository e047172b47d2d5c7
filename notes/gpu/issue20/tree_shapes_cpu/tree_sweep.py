"""tau of EAGLE-3 dynamic-tree shapes on SmolLM2 (fp32, CPU, greedy, batch up to 4): which shapes to time
next on the GPU (`bench_e2e.py --tree-shapes`). Usage: NEW=128 python tree_sweep.py [categories:]N D,K,N [D,K,N ...]
(K=1: a chain of D)."""
import importlib.resources, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "examples"))
from bench_e2e import heldout_ids
from specdec import SamplingParams, SpecConfig
from specdec.entrypoints.decoder import SpecDecoder
from specdec.models.gguf import smollm2_gguf_path

torch.set_num_threads(2)
head = Path(str(importlib.resources.files("specdec") / "assets/heads/smollm2-eagle3"))
shapes = [(int(a), int(b), int(c)) for a, b, c in (s.split(",") for s in sys.argv[2:])]
PROMPTS, _, count = sys.argv[1].rpartition(":")  # N (held-out) or categories:N
n = int(count)
ref = None
for D, K, N in shapes:
    cfg = SpecConfig(drafter="eagle3", tree="dynamic" if K > 1 else None, max_draft_len=D, topk=K,
                     max_total_draft_tokens=N, max_batch_size=4, max_seq_len=1024) if K > 1 else \
          SpecConfig(drafter="eagle3", max_draft_len=D, max_batch_size=4, max_seq_len=1024)
    dec = SpecDecoder.from_pretrained(smollm2_gguf_path(), head, cfg, device="cpu", dtype=torch.float32)
    if PROMPTS == "categories":  # the frozen per-category set (n per category), as the training's evaluation
        from specdec.train.categories import frozen_category_prompts
        from specdec.train.prompts import encode_prompt
        ids = [encode_prompt(q, dec.target.tokenizer, dec.target.info.vocab_size) for q in frozen_category_prompts(n)]
    else:
        ids = heldout_ids(dec.target, n)
    t0 = time.perf_counter(); toks = steps = 0
    for i in range(0, len(ids), 4):
        for r in dec.generate(ids[i:i + 4], SamplingParams(max_new_tokens=int(__import__("os").environ.get("NEW", "64")), ignore_eos=True), progress=False):
            toks += len(r.token_ids); steps += r.stats.steps
    print(f"D={D} K={K} N={N}: tau {(toks - len(ids)) / steps:.3f} ({steps} steps, {time.perf_counter() - t0:.0f} s)", flush=True)
