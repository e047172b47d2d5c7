"""MTP-head training: the loss falls on a tiny random target, the saved head reloads bit for
bit and decodes losslessly through the mtp plugin, and the unrolled steps compute exactly what
the MTP drafter computes at inference (draft depth k+1 == unroll step k, float64)."""

import pytest
import torch
from safetensors.torch import load_file

from specdec import SamplingParams, SpecConfig
from specdec.entrypoints.decoder import SpecDecoder
from specdec.drafters.mtp_checkpoint import load_mtp, save_mtp
from specdec.drafters.mtp_drafter import MTPDrafter
from specdec.step_state import StepState
from specdec.train.mtp_trainer import train_mtp
from specdec.train.mtp_unroll import mtp_teacher_forward, mtp_unroll
from specdec.train.plot import read_log
from specdec.train.trainer import TrainConfig
from specdec.train.ttt import ttt_attention_ref

from _mtp_heads import D, V, random_mtp
from _train_tiny import make_data, one_thread

TINY = dict(ttt_steps=4, batch_tokens=512, lr=3e-3, warmup_steps=3, log_every=1, val_every=4, val_fraction=0.1,
            val_batches=2)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def trained(train_target, tmp_path_factory):
    data = make_data(train_target, n=24)
    work = tmp_path_factory.mktemp("work")
    log = work / "log.jsonl"
    result = train_mtp(train_target, data, TrainConfig(max_steps=24, **TINY), work_dir=work, log_path=log, progress=False)
    return result, work, log


def test_a_few_mtp_training_steps_decrease_the_loss(trained):
    result, _, log = trained
    records = read_log(log)
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 25)) and result.steps == 24
    first = sum(r["loss"] for r in train[:4]) / 4
    last = sum(r["loss"] for r in train[-4:]) / 4
    assert last < first - 0.05, (first, last)
    assert all(len(r["step_acc"]) == 4 and len(r["step_loss"]) == 4 for r in train)
    assert any(r["kind"] == "val" for r in records)


def test_the_trained_head_reloads_bit_for_bit_and_mtp_greedy_equals_target_greedy(trained, train_target, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the ops' torch references (kernels are tested elsewhere)
    result, work, _ = trained
    head = result.head.cpu()
    save_mtp(head, tmp_path / "head")
    again = load_mtp(tmp_path / "head", layout="specdec")
    for (k, a), (k2, b) in zip(head.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k
    assert head.lm_head is None  # logits through the target's shared lm_head
    ck = load_file(str(work / "checkpoint" / "model.safetensors"))  # the resumable checkpoint, same layout
    assert set(ck) == set(head.state_dict())
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11]]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    base = dict(max_batch_size=2, max_seq_len=64, kv_block_size=4)
    ref = SpecDecoder.from_pretrained(train_target, None, SpecConfig(drafter="none", **base)).generate(prompts, params)
    for shape in (dict(tree="linear", max_draft_len=3), dict(tree="dynamic", max_draft_len=3, topk=2, max_total_draft_tokens=6)):
        dec = SpecDecoder.from_pretrained(train_target, tmp_path / "head", SpecConfig(drafter="mtp", **base, **shape))
        out = dec.generate(prompts, params)
        assert [o.token_ids for o in out] == [r.token_ids for r in ref], shape


def test_mtp_unroll_steps_reproduce_the_mtp_drafters_chain_at_inference():
    """Row L-1 of unroll step k == draft depth k+1 after a prompt of L tokens, when the sequence
    continues with the drafter's own chain."""
    Dd, L = 5, 12
    model = random_mtp(seed=1, dtype=torch.float64)
    gen = torch.Generator().manual_seed(7)
    embed = torch.nn.Embedding(V, D).to(torch.float64)
    torch.nn.init.normal_(embed.weight, generator=gen)
    head = torch.nn.Linear(D, V, bias=False).to(torch.float64)
    torch.nn.init.normal_(head.weight, generator=gen)
    seq0 = torch.randint(0, V, (L + Dd + 4,), generator=gen)
    H = torch.randn(L + Dd + 4, D, generator=gen, dtype=torch.float64)
    cfg = SpecConfig(drafter="mtp", max_draft_len=Dd, max_batch_size=1, max_seq_len=64, kv_block_size=4)
    drafter = MTPDrafter(model, cfg, embed=embed, head=head)
    seen = []
    with torch.no_grad():
        drafter.prefill(0, seq0[1 : L + 1], H[:L])  # prompt seq0[:L], first generated token seq0[L]
        hook = head.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
        tree = drafter.propose(StepState.for_drafting(
            root_tokens=seq0[L : L + 1], committed_len=torch.tensor([L]), accept_length=torch.tensor([-1]),
            accept_tokens=torch.full((1, Dd + 1), -1), active=torch.tensor([True]), drafter=drafter,
        ))
        hook.remove()
    assert tree.parents[0].tolist() == [-1, 0, 1, 2, 3, 4]
    draft_logits = [drafter.root_logits[0]] + [x[0, 0] for x in seen]  # depth 1..D
    assert len(draft_logits) == Dd

    seq = torch.cat([seq0[: L + 1], tree.tokens[0, 1:]])[None]  # [1, T]
    T = seq.shape[1]
    seen = []
    hook = head.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    with torch.no_grad():
        mtp_unroll(model, embed, head, H[:T][None], seq, torch.zeros(1, T, V, dtype=torch.float64),
                   torch.zeros(1, T, dtype=torch.int64), torch.ones(1, T), torch.ones(1, T, dtype=torch.bool),
                   steps=Dd, attention=ttt_attention_ref, recompute=False)
    hook.remove()
    step_logits = seen[0::2]  # each step: the loss's logits, then the accuracy's (same rows)
    for k in range(Dd):
        torch.testing.assert_close(step_logits[k][0, L - 1], draft_logits[k], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(seen[2 * k + 1][0, L - 1], draft_logits[k], rtol=1e-9, atol=1e-9)


def test_unroll_step_zero_is_the_heads_sequence_forward_and_steps_are_weighted(train_target):
    model = random_mtp(seed=2)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (2, 10), generator=gen)
    teacher = mtp_teacher_forward(train_target.model, tokens)
    assert teacher.last_hidden.shape == (2, 10, D) and teacher.logits.shape == (2, 10, V)
    embed, lm_head = train_target.model.embed, train_target.model.lm_head
    seen = []
    hook = lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    res = mtp_unroll(model, embed, lm_head, teacher.last_hidden, tokens, teacher.logits, teacher.argmax,
                     torch.ones(2, 10), torch.ones(2, 10, dtype=torch.bool), steps=3, step_weight=0.5, recompute=False)
    hook.remove()
    _, logits = model.sequence_forward(teacher.last_hidden, embed(torch.roll(tokens, -1, 1)), head=lm_head)
    torch.testing.assert_close(seen[0], logits[:, :8], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res.loss, sum(0.5**k * res.step_loss[k] for k in range(3)))
    assert res.count.tolist() == [2 * 8, 2 * 7, 2 * 6]
    res.loss.backward()
    assert model.input_proj.weight.grad is not None and model.input_proj.weight.grad.abs().sum() > 0
    # recomputed logits in backward give the same loss and gradient
    g = model.input_proj.weight.grad.clone()
    model.zero_grad()
    res2 = mtp_unroll(model, embed, lm_head, teacher.last_hidden, tokens, teacher.logits, teacher.argmax,
                      torch.ones(2, 10), torch.ones(2, 10, dtype=torch.bool), steps=3, step_weight=0.5, recompute=True)
    res2.loss.backward()
    torch.testing.assert_close(res2.loss, res.loss)
    torch.testing.assert_close(model.input_proj.weight.grad, g)


def test_the_mtp_command_line_writes_a_plugin_loadable_head_log_curves_record_and_mtp_eval(train_target, tmp_path, monkeypatch):
    import json

    from specdec.train import main

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    out = tmp_path / "head"
    argv = [
        "mtp", "--target", str(train_target.path), "--out", str(out), "--work", str(tmp_path / "work"),
        "--num-prompts", "30", "--roots", "stdlib", "--max-new-tokens", "12", "--max-prompt-tokens", "160",
        "--gen-batch-size", "8", "--steps", "3", "--batch-tokens", "1024", "--ttt-steps", "3", "--log-every", "1",
        "--val-every", "2", "--eval", "--eval-prompts", "2", "--eval-setups", "target,linear,tree",
        "--eval-max-new-tokens", "8", "--draft-vocab-size", "32",
    ]
    assert main(argv) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {"config.json", "model.safetensors", "draft_vocab.safetensors", "training_curves.png",
                     "train_log.jsonl", "TRAINING.md", "eval.json"}
    from specdec.drafters.mtp_checkpoint import load_draft_vocab

    assert load_draft_vocab(out, vocab_size=V).shape == (32,)  # the evaluation below drafted through it
    head = load_mtp(out, layout="specdec", dtype=torch.bfloat16)
    assert head.config.hidden_size == D and head.lm_head is None
    rows = json.loads((out / "eval.json").read_text())
    assert [r["name"] for r in rows] == ["target-only", "mtp linear D=5", "mtp tree D=6 K=8 N=48"]
    assert rows[0]["tau"] == 1.0 and all(r["tau"] >= 1.0 and r["same_as_target"] == 1.0 for r in rows[1:])
    record = (out / "TRAINING.md").read_text()
    assert "python -m specdec.train mtp" in record and "| mtp tree D=6 K=8 N=48 |" in record
    assert "draft vocabulary (draft_vocab.safetensors): 32 tokens covering" in record


def test_the_draft_vocabulary_loss_is_the_renormalized_soft_ce_on_its_rows(train_target):
    """`mtp_unroll(target_ids=...)`: the head's logits over those lm_head rows, the teacher's
    distribution renormalized over them, rows whose teacher argmax lies outside weighing 0, and
    predictions as target ids; with every id it is the full-vocabulary loss."""
    from specdec.drafters.mtp_drafter import restricted_head

    model = random_mtp(seed=3)
    tokens = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    embed, lm_head = train_target.model.embed, train_target.model.lm_head
    weights, response = torch.ones(2, 9), torch.ones(2, 9, dtype=torch.bool)
    full_teacher = mtp_teacher_forward(train_target.model, tokens)
    full = mtp_unroll(model, embed, lm_head, full_teacher.last_hidden, tokens, full_teacher.logits,
                      full_teacher.argmax, weights, response, steps=2, recompute=False)
    every = torch.arange(V)
    t_all = mtp_teacher_forward(train_target.model, tokens, target_ids=every)
    same = mtp_unroll(model, embed, restricted_head(lm_head.weight, every), t_all.last_hidden, tokens, t_all.logits,
                      t_all.argmax, weights, response, steps=2, recompute=False, target_ids=every)
    torch.testing.assert_close(same.loss, full.loss, rtol=1e-6, atol=1e-6)

    ids = torch.arange(0, V, 2)  # every other token
    sub = mtp_teacher_forward(train_target.model, tokens, target_ids=ids)
    assert sub.logits.shape == (2, 9, ids.numel()) and torch.equal(sub.argmax, full_teacher.argmax)
    res = mtp_unroll(model, embed, restricted_head(lm_head.weight, ids), sub.last_hidden, tokens, sub.logits,
                     sub.argmax, weights, response, steps=1, recompute=False, target_ids=ids)
    # step 0 by hand: rows t predict x_{t+2} against p_{t+1} over the draft rows
    n = 9 - 2
    logits = model.logits(_step0_state(model, embed, tokens, sub.last_hidden)[:, :n], restricted_head(lm_head.weight, ids))
    p = torch.softmax(full_teacher.logits[:, 1 : 1 + n][..., ids].float(), -1)
    ce = torch.logsumexp(logits.float(), -1) - (p * logits.float()).sum(-1)  # [2, n]
    keep = (full_teacher.argmax[:, 1 : 1 + n] % 2 == 0).float()
    torch.testing.assert_close(res.step_loss[0], (ce * keep).sum() / keep.sum(), rtol=1e-5, atol=1e-6)


def _step0_state(model, embed, tokens, last_hidden):
    """Step 0's block output, as `mtp_unroll` computes it (causal attention over the sequence)."""
    from specdec.train.ttt import growing_attend, ttt_attention

    B, T = tokens.shape
    attend = growing_attend(ttt_attention, model.config.head_dim**-0.5)
    emb = embed(torch.roll(tokens, -1, 1))
    return model.block(model.fuse(emb, last_hidden), torch.arange(T)[None].expand(B, T), attend)


def test_training_over_the_draft_vocabulary_lowers_the_loss_and_exports_that_vocabulary(train_target, tmp_path):
    from specdec.drafters.mtp_checkpoint import load_draft_vocab
    from specdec.train.mtp_trainer import mtp_draft_vocab
    from specdec.train.pipeline import RECIPES

    data = make_data(train_target, n=24)
    cfg = TrainConfig(max_steps=16, draft_vocab_size=48, mtp_loss_vocab="draft", **TINY)
    log = tmp_path / "log.jsonl"
    result = train_mtp(train_target, data, cfg, work_dir=tmp_path / "work", log_path=log, progress=False)
    train = [r for r in read_log(log) if r["kind"] == "train"]
    assert sum(r["loss"] for r in train[-4:]) / 4 < sum(r["loss"] for r in train[:4]) / 4 - 0.05
    ids, cover = mtp_draft_vocab(train_target, data, cfg)
    assert ids.numel() == 48 and bool((ids[1:] > ids[:-1]).all()) and result.coverage == cover < 1.0
    (tmp_path / "head").mkdir()
    RECIPES["mtp"]().extras(tmp_path / "head", train_target, data, cfg)
    assert torch.equal(load_draft_vocab(tmp_path / "head"), ids)
    with pytest.raises(ValueError, match="mtp_loss_vocab"):
        TrainConfig(mtp_loss_vocab="tiny")
