"""Tensor parallelism on the CPU: gloo ranks started with torch.multiprocessing, fp32.

One start of 4 ranks serves every check (starting them is the slow part): first tp_size 4 over
the whole world (one query head per rank; the 2 KV heads replicated, each on the 2 ranks
whose query heads read it), then tp_size 2 in two groups of 2 ranks (KV heads split). Each
rank loads tiny Llama, Qwen3, Mistral and Qwen2 checkpoints (Qwen2: tied embeddings, qkv
bias and a vocabulary of 97, padded on every tp size; Mistral: saved in several safetensors
shards) and generates for a batch of 3 prompts, greedy: EAGLE-3 chain and tree with a
random head on Llama / Qwen3 / Mistral, target-only on Qwen2, n-gram on Llama (whose
drafts are accepted on these repetitive outputs: relocation on each rank's KV shard); then
a sampled EAGLE-3 tree run on Llama with a fixed seed. Every rank's tokens must equal the
same run at tp_size 1 in this process. Bad `tp_size` values are `ConfigError`s raised
before any weight loads (their folders hold a config.json and no weights at all). The
launcher path (`torchrun ... -m specdec.entrypoints.cli generate --tp 2`) is one more test at the end.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import given, note, strategies as st

from specdec import SamplingParams, SpecConfig
from specdec.config import ConfigError
from specdec.entrypoints.decoder import SpecDecoder
from specdec.drafters.eagle3_checkpoint import save_eagle3
from specdec.models.config import ModelConfig, RopeConfig
from specdec.models.parallel import ShardLayout

from _chat_tokenizer import save_chat_tokenizer
from _eagle3_heads import random_head
from _tiny_models import make_checkpoint

WORLD = 4
TP_SIZES = (4, 2)
LAYERS = 4
NEW = 8
PROMPTS = [[5, 17, 33], [9] * 11 + [40, 2], [71]]
FAMILIES = {  # name -> (family, make_checkpoint overrides, greedy cases run on it)
    "llama": ("llama", {}, ("eagle3-chain", "eagle3-tree", "ngram-chain")),
    "qwen3": ("qwen3", {}, ("eagle3-chain", "eagle3-tree")),
    "mistral": ("mistral", {"max_shard_size": "40KB"}, ("eagle3-chain", "eagle3-tree")),
    "qwen2-v97": ("qwen2", {"vocab_size": 97}, ("target-only",)),
}
GREEDY = {  # name -> SpecConfig fields
    "target-only": dict(drafter="none"),
    "eagle3-chain": dict(drafter="eagle3", max_draft_len=4),
    "eagle3-tree": dict(drafter="eagle3", tree="dynamic", topk=3, max_draft_len=4, max_total_draft_tokens=10),
    "ngram-chain": dict(drafter="ngram", max_draft_len=4),
}
SAMPLED = dict(drafter="eagle3", verifier="speculative", tree="dynamic", topk=2, max_draft_len=3)
SAMPLING = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=NEW, ignore_eos=True, seed=1234)
DEADLINE_S = 300  # a rank stuck in a collective fails the test instead of hanging it

pytestmark = pytest.mark.filterwarnings("ignore:drafter='eagle3' accepts almost nothing:UserWarning")


def spec(**kw) -> SpecConfig:
    return SpecConfig(**{"max_batch_size": len(PROMPTS), "max_seq_len": 80, "kv_block_size": 4, **kw})


def run_cases(paths: dict, tp_size: int) -> dict:
    """Every generation of this file at `tp_size`: {case: tokens per prompt}, plus the layout seen."""
    out, shapes = {}, {}
    for name, (_, _, cases) in FAMILIES.items():
        target = None
        for case in cases:
            fields = GREEDY[case]
            head = paths[f"head-{name}"] if fields["drafter"] == "eagle3" else None
            dec = SpecDecoder.from_pretrained(target or paths[name], head, spec(**fields), tp_size=tp_size)
            target = dec.target
            res = dec.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, ignore_eos=True))
            out[f"{name}/{case}"] = [r.token_ids for r in res]
            out[f"{name}/{case}/accepted"] = sum(sum(r.stats.accepted_per_step) for r in res)
        m = target.model
        shapes[name] = dict(
            qkv_rows=m.layers[0].self_attn.qkv_proj.weight.shape[0], embed_rows=m.embed_tokens.weight.shape[0],
            ffn_rows=m.layers[0].mlp.gate_up_proj.weight.shape[0], kv_heads=m.num_kv_heads_per_layer[0],
            cache_heads=dec.engine.runner.cache.num_kv_heads[0],
        )
        if name == "llama":
            dec = SpecDecoder.from_pretrained(target, paths["head-llama"], spec(**SAMPLED), tp_size=tp_size, seed=7)
            res = dec.generate(PROMPTS, SAMPLING)
            out["llama/sampled"] = [r.token_ids for r in res]
            out["llama/sampled/accepted"] = sum(sum(r.stats.accepted_per_step) for r in res)
    return {"tokens": out, "shapes": shapes}


def bad_tp_errors(paths: dict) -> dict:
    """The messages of the `tp_size` errors a job of WORLD ranks must raise before loading."""
    errors = {}
    for key, path, tp in (("world", paths["no-weights"], 8), ("divides-world", paths["no-weights"], 3),
                          ("heads", paths["six-heads"], 4)):
        try:
            SpecDecoder.from_pretrained(path, None, spec(), tp_size=tp)
            errors[key] = None
        except ConfigError as e:
            errors[key] = f"ConfigError: {e}"
        except Exception as e:  # a weight load attempted (no weights there): the wrong order
            errors[key] = f"{type(e).__name__}: {e}"
    return errors


def worker(rank: int, port: int, paths: dict, out_dir: str) -> None:
    """One rank: torchrun's environment, so `from_pretrained` starts the gloo process group."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), TRITON_INTERPRET="0")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    result = {"errors": bad_tp_errors(paths)}
    for tp in TP_SIZES:
        t0 = time.perf_counter()
        result[str(tp)] = run_cases(paths, tp)
        result[f"seconds-{tp}"] = time.perf_counter() - t0
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(paths: dict, out_dir: Path) -> list[dict]:
    """Start the WORLD ranks and wait for their results (rank order).

    Forked, not spawned, while this process has not initialized CUDA: a spawned rank re-imports
    torch, transformers and this module (measured ~30 s of the 2-core budget for 4 ranks); a
    fork inherits them. The ranks only ever run on the CPU (gloo)."""
    method = "spawn" if torch.cuda.is_available() and torch.cuda.is_initialized() else "fork"
    ctx = mp.start_processes(worker, args=(free_port(), paths, str(out_dir)), nprocs=WORLD, join=False,
                             start_method=method)
    deadline = time.monotonic() + DEADLINE_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {WORLD} gloo ranks did not finish within {DEADLINE_S} s (a collective out of step?)")
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    out = {}
    for name, (family, kw, cases) in FAMILIES.items():
        make_checkpoint(family, root / name, seed=3, num_hidden_layers=LAYERS, **kw)
        out[name] = str(root / name)
        if any(GREEDY[c]["drafter"] == "eagle3" for c in cases):
            head = random_head(seed=1, hidden_size=64, target_hidden_size=64, head_dim=16, capture_layers=(1, 2, 3),
                               std=0.1, vocab_size=kw.get("vocab_size", 96))
            save_eagle3(head, root / f"head-{name}")
            out[f"head-{name}"] = str(root / f"head-{name}")
    six_heads = dict(num_attention_heads=6, num_key_value_heads=6, hidden_size=48, intermediate_size=96)
    for name, kw in (("no-weights", {}), ("six-heads", six_heads)):
        make_checkpoint("llama", root / name, num_hidden_layers=1, **kw)
        for f in (root / name).glob("*.safetensors"):
            f.unlink()  # only config.json: any attempt to read weights fails differently
        out[name] = str(root / name)
    make_checkpoint("llama", root / "cli", seed=5, num_hidden_layers=2)
    save_chat_tokenizer(root / "cli")  # `--raw` needs a tokenizer to encode the prompts
    out["cli"] = str(root / "cli")
    return out


@pytest.fixture(scope="module")
def runs(paths, tmp_path_factory, monkeypatch_module):
    """(tp_size 1 in this process, the WORLD ranks' results)."""
    monkeypatch_module.setenv("TRITON_INTERPRET", "0")  # ops through their references (compared elsewhere)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        single = run_cases(paths, 1)
    ranks = spawn(paths, tmp_path_factory.mktemp("tp-out"))
    return single, ranks


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp_:
        yield mp_


@pytest.mark.parametrize("tp", TP_SIZES)
def test_greedy_output_at_tp_2_and_4_equals_tp_1_token_for_token_on_every_rank(runs, tp):
    single, ranks = runs
    for name, (_, _, cases) in FAMILIES.items():
        for case in cases:
            key = f"{name}/{case}"
            for r, res in enumerate(ranks):
                assert res[str(tp)]["tokens"][key] == single["tokens"][key], f"{key}, tp {tp}, rank {r}"
            assert all(len(t) == NEW for t in single["tokens"][key])


def test_ngram_drafts_are_accepted_so_each_rank_relocates_its_own_kv_shard(runs):
    single, ranks = runs
    for name in (n for n, (_, _, cases) in FAMILIES.items() if "ngram-chain" in cases):
        key = f"{name}/ngram-chain/accepted"
        assert single["tokens"][key] > 0, key
        for res in ranks:
            for tp in TP_SIZES:
                assert res[str(tp)]["tokens"][key] == single["tokens"][key]


@pytest.mark.parametrize("tp", TP_SIZES)
def test_a_sampled_run_with_a_fixed_seed_is_identical_across_ranks_and_equal_to_tp_1(runs, tp):
    single, ranks = runs
    ref = single["tokens"]["llama/sampled"]
    assert single["tokens"]["llama/sampled/accepted"] > 0  # the sampled acceptance path ran
    greedy = single["tokens"]["llama/eagle3-tree"]
    assert ref != greedy  # really sampled
    for r, res in enumerate(ranks):
        assert res[str(tp)]["tokens"]["llama/sampled"] == ref, f"tp {tp}, rank {r}"


@pytest.mark.parametrize("tp", TP_SIZES)
def test_each_rank_holds_only_its_shard(runs, tp):
    """Local heads, ffn rows and (padded) vocabulary rows; KV heads replicated at tp 4 (Hkv 2)."""
    _, ranks = runs
    for name, (family, kw, _) in FAMILIES.items():
        hd = {"qwen3": 32, "mistral": 16}.get(family, 16)
        vocab = kw.get("vocab_size", 96)
        kv = 2 // tp if tp <= 2 else 1
        for res in ranks:
            s = res[str(tp)]["shapes"][name]
            assert s["qkv_rows"] == (4 // tp + 2 * kv) * hd, name
            assert s["kv_heads"] == kv and s["cache_heads"] == kv
            assert s["ffn_rows"] == 2 * 112 // tp
            assert s["embed_rows"] == -(-vocab // tp)


def test_a_bad_tp_size_is_a_config_error_before_any_weight_loads(runs, paths):
    _, ranks = runs
    for res in ranks:
        e = res["errors"]
        assert e["world"].startswith("ConfigError") and "larger than the job's world size 4" in e["world"]
        assert e["divides-world"].startswith("ConfigError") and "does not divide the world size 4" in e["divides-world"]
        assert e["heads"].startswith("ConfigError") and "num_heads=6" in e["heads"] and "[1, 2, 3, 6]" in e["heads"]
    # no process group in this process: an error naming torchrun, before anything loads
    with pytest.raises(ConfigError, match=r"tp_size=2 needs a torch.distributed job.*torchrun --nproc-per-node 2"):
        SpecDecoder.from_pretrained(paths["no-weights"], None, spec(), tp_size=2)
    with pytest.raises(ConfigError, match=r"adaptive=True cannot run with tp_size=2"):
        SpecDecoder.from_pretrained(paths["no-weights"], None, spec(adaptive=True), tp_size=2)
    for bad in (0, True, 2.0, "2"):
        with pytest.raises(ConfigError, match=r"tp_size must be an int >= 1"):
            SpecDecoder.from_pretrained(paths["no-weights"], None, spec(), tp_size=bad)


def _config(H: int, Hkv: int, F: int, V: int, hd: int = 4) -> ModelConfig:
    return ModelConfig(model_type="llama", vocab_size=V, hidden_size=8, intermediate_size=F, num_layers=1,
                       num_heads=H, num_kv_heads=Hkv, head_dim=hd, rms_norm_eps=1e-5, rope=RopeConfig(),
                       max_position_embeddings=64)


@given(st.sampled_from([(1, 1), (2, 1), (4, 2), (8, 2), (8, 8), (16, 4), (32, 8)]),
       st.sampled_from([1, 2, 4, 8]), st.integers(1, 40), st.integers(1, 300))
def test_the_shards_of_every_tensor_tile_it_and_each_rank_reads_the_kv_heads_of_its_query_heads(heads, tp, ffn, vocab):
    H, Hkv = heads
    F = ffn * tp
    cfg = _config(H, Hkv, F, vocab)
    note(f"H={H} Hkv={Hkv} F={F} V={vocab} tp={tp}")
    if H % tp or (Hkv % tp and tp % Hkv):
        with pytest.raises(ConfigError, match=rf"tp_size={tp} does not divide"):
            ShardLayout.of(cfg, tp, 0)
        return
    layouts = [ShardLayout.of(cfg, tp, r) for r in range(tp)]
    hd = cfg.head_dim
    tensors = (("layers.0.self_attn.qkv_proj.weight", 0, H * hd), ("layers.0.self_attn.o_proj.weight", -1, H * hd),
               ("layers.0.mlp.gate_up_proj.weight", 1, F), ("layers.0.mlp.down_proj.weight", -1, F),
               ("embed_tokens.weight", -1, vocab), ("lm_head.weight", -1, vocab))
    for name, chunk, full in tensors:
        parts = [lay.source_slice(name, chunk) for lay in layouts]
        if tp == 1:
            assert parts == [None]
            continue
        assert all(p[3] == full for p in parts)
        covered = [i for p in parts for i in range(p[1], p[2])]
        assert covered == list(range(full)), name  # disjoint, in rank order, complete
    for lay in layouts:  # the KV heads held are the ones the local query heads read (GQA group H/Hkv)
        q_heads = range(lay.rank * lay.num_heads, (lay.rank + 1) * lay.num_heads)
        needed = sorted({h // (H // Hkv) for h in q_heads})
        assert needed == list(range(lay.kv_head_start, lay.kv_head_start + lay.num_kv_heads))
        assert lay.vocab_per_rank * tp >= vocab
    if tp > 1:
        kv = [lay.source_slice("layers.0.self_attn.qkv_proj.weight", 1) for lay in layouts]
        assert {i for p in kv for i in range(p[1], p[2])} == set(range(Hkv * hd))  # every KV head is held somewhere


def cli_argv(paths: dict) -> list[str]:
    """`specdec generate` of two raw prompts (batch 2), greedy, 8 new tokens, on the tiny CLI checkpoint."""
    return ["generate", "--target", paths["cli"], "--device", "cpu", "--raw", "--max-new-tokens", "8", "--ignore-eos",
            "--no-stream", "w1 w2 w3", "w7"]


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason="torchrun needs torch.distributed with the gloo backend, which this torch build lacks")
def test_torchrun_runs_specdec_cli_generate_at_tp_2_and_only_rank_0_prints_the_tp_1_text(paths, capsys, monkeypatch):
    """`torchrun --nproc-per-node 2 -m specdec.entrypoints.cli generate --tp 2 ...` (each rank runs
    `python -m specdec.entrypoints.cli`) prints exactly what `specdec generate` prints at tp 1, once."""
    from specdec.entrypoints.cli import main

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the ops' references, as in the spawned ranks
    assert main(cli_argv(paths)) == 0
    single = capsys.readouterr().out
    assert single.count("w") >= 2  # two answers printed
    env = dict(os.environ, TRITON_INTERPRET="0", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "specdec.entrypoints.cli", *cli_argv(paths), "--tp", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=DEADLINE_S)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stderr[-4000:]}"
    assert done.stdout == single
