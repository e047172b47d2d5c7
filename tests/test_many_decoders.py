"""Any number of decoders of different dtypes, models and configs live in one process.

Users build several decoders in one process (a notebook, a benchmark comparing setups, a
server that reloads its model). torch.compile keeps its graphs and its recompile count per
function code object, so compiled pieces shared by the whole process would count every
decoder's dtypes and shapes against one limit (a bf16 then an fp32 decoder on the H200
failed with `FailOnRecompileLimitHit`). Each decoder compiles its own copies
(`specdec.compile_scope`); this test builds six, compiled (and captured on CUDA), one after
another in one process, and checks that each generates its eager tokens, also when used
again after the others were built. fp32 compares whole outputs; bf16 and fp16 compare a
prefix (compiled pointwise pieces round once where eager rounds per op, so a near-tie
argmax can flip late in a random model).

On CPU the ops run through their torch references (`e2e_cpu`), eager and compiled alike: the
subject here is torch.compile's graphs per decoder, not the Triton kernels (compared with
their references in their own suites; interpreted, they made this test take ~6 minutes).
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder
from specdec.drafters.eagle3_checkpoint import save_eagle3

from _eagle3_heads import random_head
from _mtp_heads import e2e_cpu  # noqa: F401
from _tiny_models import make_checkpoint

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
PROMPTS = [[5, 17, 33, 8], [9, 9, 9, 40, 2], [71]]
NEW_TOKENS = 12
SAME_PREFIX = {torch.float32: NEW_TOKENS, torch.bfloat16: 4, torch.float16: 6}
BASE = dict(max_batch_size=2, max_seq_len=64, kv_block_size=4)
SETUPS = [  # (family, dtype, config)
    ("llama", torch.float32, dict(drafter="none")),
    ("llama", torch.bfloat16, dict(drafter="eagle3", max_draft_len=3)),
    ("qwen3", torch.float16, dict(drafter="eagle3", tree="dynamic", topk=2, max_draft_len=3, max_total_draft_tokens=5)),
    ("qwen3", torch.float32, dict(drafter="eagle3", max_draft_len=2)),
    ("llama", torch.float16, dict(drafter="none")),
    ("qwen3", torch.bfloat16, dict(drafter="eagle3", tree="dynamic", topk=3, max_draft_len=2, max_total_draft_tokens=6)),
]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.usefixtures("e2e_cpu"),
    pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning"),
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("many")
    for family in ("llama", "qwen3"):
        make_checkpoint(family, root / family, num_hidden_layers=8, seed=4)
    head = random_head(seed=2, hidden_size=64, target_hidden_size=64, head_dim=16, capture_layers=(1, 3, 4), std=0.1)
    save_eagle3(head, root / "head")
    return root


def _decoder(checkpoints, family, dtype, cfg, compiled: bool) -> SpecDecoder:
    target = specdec.load_target(checkpoints / family, device=DEVICE, dtype=dtype)
    draft = None if cfg["drafter"] == "none" else checkpoints / "head"
    knobs = dict(compile=compiled, cuda_graphs=compiled and CUDA)
    return SpecDecoder.from_pretrained(target, draft, SpecConfig(**BASE, **cfg, **knobs))


def _run(dec: SpecDecoder) -> list[list[int]]:
    out = []
    for i in range(0, len(PROMPTS), 2):
        out += [r.token_ids for r in dec.generate(PROMPTS[i : i + 2], SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))]
    return out


def _prefix(tokens: list[list[int]], dtype) -> list[list[int]]:
    return [t[: SAME_PREFIX[dtype]] for t in tokens]


def test_six_decoders_of_different_dtypes_models_and_configs_in_one_process(checkpoints):
    eager = [_run(_decoder(checkpoints, *setup, compiled=False)) for setup in SETUPS]
    decoders = []
    for setup, want in zip(SETUPS, eager):
        dec = _decoder(checkpoints, *setup, compiled=True)
        assert dec.compiled and dec.cuda_graphs == CUDA
        dec.warmup(progress=False)
        got = _run(dec)
        assert [len(t) for t in got] == [NEW_TOKENS] * len(PROMPTS), setup
        assert _prefix(got, setup[1]) == _prefix(want, setup[1]), setup
        decoders.append((dec, got))
    # every decoder still works, with its own graphs, after the others were built and used
    for dec, got in decoders:
        assert _run(dec) == got
