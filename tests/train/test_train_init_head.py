"""Warm starts (`TrainConfig.init_head`, `--init-head`): a run starts from a saved head's weights
and draft vocabulary with a fresh optimizer, so training goes on across machines and sessions on
new data; a head that does not match the settings is refused with both values named."""

import dataclasses

import pytest
import torch

from specdec.drafters.eagle3_checkpoint import save_eagle3
from specdec.drafters.mtp_checkpoint import save_mtp
from specdec.train import main
from specdec.train.mtp_trainer import train_mtp
from specdec.train.plot import read_log
from specdec.train.trainer import TrainConfig, train_eagle3

from _train_tiny import make_data, one_thread, reference_ops

TINY = dict(draft_vocab_size=48, batch_tokens=512, lr=3e-3, warmup_steps=3, log_every=1, val_every=100,
            val_fraction=0.1, val_batches=2)
STILL = dict(lr=1e-12, warmup_steps=0)  # one optimizer step that moves no weight by more than ~1e-12


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread(), reference_ops():
        yield


@pytest.fixture(scope="module")
def eagle3_head(train_target, data, tmp_path_factory):
    """A head trained for 24 steps: its saved folder (float32) and the head itself."""
    work = tmp_path_factory.mktemp("first")
    result = train_eagle3(train_target, data, TrainConfig(max_steps=24, **TINY), work_dir=work,
                          log_path=work / "log.jsonl", progress=False)
    save_eagle3(result.head.cpu(), work / "head")
    return work / "head", result.head.cpu()


def _first_loss(log) -> float:
    return next(r["loss"] for r in read_log(log) if r["kind"] == "train")


def test_a_warm_start_begins_at_the_saved_head(train_target, data, eagle3_head, tmp_path):
    folder, saved = eagle3_head
    cfg = TrainConfig(max_steps=1, init_head=str(folder), **{**TINY, **STILL})
    result = train_eagle3(train_target, data, cfg, work_dir=tmp_path / "w", progress=False)
    for key, value in saved.state_dict().items():
        torch.testing.assert_close(result.head.state_dict()[key].cpu(), value, rtol=0, atol=1e-6, msg=key)
    assert torch.equal(result.head.d2t.cpu(), saved.d2t)  # the head's draft vocabulary, not one built anew


def test_a_warm_start_goes_on_from_the_trained_loss_on_new_data(train_target, eagle3_head, tmp_path):
    folder, _ = eagle3_head
    new = make_data(train_target, n=24, seed=7)  # another session's prompts
    fresh = TrainConfig(max_steps=2, **TINY)
    warm = dataclasses.replace(fresh, init_head=str(folder))
    train_eagle3(train_target, new, fresh, work_dir=tmp_path / "fresh", log_path=tmp_path / "fresh.jsonl", progress=False)
    train_eagle3(train_target, new, warm, work_dir=tmp_path / "warm", log_path=tmp_path / "warm.jsonl", progress=False)
    fresh_loss, warm_loss = _first_loss(tmp_path / "fresh.jsonl"), _first_loss(tmp_path / "warm.jsonl")
    # 24 steps took the first run's loss down by well over 0.05 (test_train_loop); on unseen prompts of
    # the same target the trained head starts lower than a random one
    assert warm_loss < fresh_loss - 0.05, (warm_loss, fresh_loss)


@pytest.mark.parametrize("change, message", [
    (dict(draft_vocab_size=32), r"draft_vocab_size=48, the training settings ask for draft_vocab_size=32"),
    (dict(capture_layers=(1, 2, 3)), r"capture_layers=\(1, 3, 4\), the training settings ask for capture_layers=\(1, 2, 3\)"),
    (dict(fc_norm=False), r"fc_norm=True, the training settings ask for fc_norm=False"),
])
def test_a_head_that_differs_from_the_settings_is_refused(train_target, data, eagle3_head, tmp_path, change, message):
    folder, _ = eagle3_head
    cfg = TrainConfig(max_steps=1, init_head=str(folder), **{**TINY, **change})
    with pytest.raises(ValueError, match=message):
        train_eagle3(train_target, data, cfg, work_dir=tmp_path, progress=False)


def test_a_warm_start_with_more_draft_layers_starts_as_the_saved_head_and_trains_the_new_one(
        train_target, data, eagle3_head, tmp_path):
    """--draft-layers 2 from a one-layer head: the added layer starts as an identity (the same
    first loss as the one-layer warm start, to float32 rounding), then trains (its o_proj and
    down_proj leave zero); its checkpoints reload on resume (speculators' layers.{i})."""
    folder, saved = eagle3_head
    one = TrainConfig(max_steps=1, init_head=str(folder), **{**TINY, **STILL})
    two = dataclasses.replace(one, draft_layers=2)
    train_eagle3(train_target, data, one, work_dir=tmp_path / "one", log_path=tmp_path / "one.jsonl", progress=False)
    deep = train_eagle3(train_target, data, two, work_dir=tmp_path / "two", log_path=tmp_path / "two.jsonl",
                        progress=False)
    assert deep.head.config.num_layers == 2
    assert _first_loss(tmp_path / "two.jsonl") == pytest.approx(_first_loss(tmp_path / "one.jsonl"), rel=1e-5)
    for key, value in saved.state_dict().items():  # the first layer, fc, norm, lm_head: the saved head's
        torch.testing.assert_close(deep.head.state_dict()[key].cpu(), value, rtol=0, atol=1e-6, msg=key)
    cfg = dataclasses.replace(two, max_steps=4, lr=3e-3, warmup_steps=1)
    straight = train_eagle3(train_target, data, cfg, work_dir=tmp_path / "a", progress=False)
    layer = straight.head.later_layers[0]
    assert float(layer.self_attn.o_proj.weight.detach().abs().max()) > 0
    assert float(layer.mlp.down_proj.weight.detach().abs().max()) > 0
    train_eagle3(train_target, data, cfg, work_dir=tmp_path / "b", progress=False, stop_after=2)
    resumed = train_eagle3(train_target, data, cfg, work_dir=tmp_path / "b", progress=False)
    for key, value in straight.head.state_dict().items():
        assert torch.equal(resumed.head.state_dict()[key], value), key


def test_a_checkpoint_of_other_draft_layers_is_not_resumed(train_target, data, tmp_path):
    cfg = TrainConfig(max_steps=2, draft_layers=2, **TINY)
    train_eagle3(train_target, data, cfg, work_dir=tmp_path, progress=False, stop_after=1)
    with pytest.raises(ValueError, match=r"checkpoint has draft_layers=2, the config asks for 1"):
        train_eagle3(train_target, data, dataclasses.replace(cfg, draft_layers=1), work_dir=tmp_path, progress=False)


def test_a_head_with_more_draft_layers_than_asked_is_refused(train_target, data, tmp_path):
    first = train_eagle3(train_target, data, TrainConfig(max_steps=1, draft_layers=2, **TINY), work_dir=tmp_path / "a",
                         progress=False)
    assert first.head.config.num_layers == 2 and len(first.head.later_layers) == 1
    save_eagle3(first.head.cpu(), tmp_path / "head")
    cfg = TrainConfig(max_steps=1, init_head=str(tmp_path / "head"), **TINY)
    with pytest.raises(ValueError, match=r"has 2 draft layers, the training settings ask for draft_layers=1; "
                                         r"pass --draft-layers 2 or more"):
        train_eagle3(train_target, data, cfg, work_dir=tmp_path / "b", progress=False)


def test_a_resumable_checkpoint_comes_before_the_init_head(train_target, data, eagle3_head, tmp_path):
    folder, _ = eagle3_head
    cfg = TrainConfig(max_steps=4, **TINY)
    straight = train_eagle3(train_target, data, cfg, work_dir=tmp_path / "a", progress=False)
    train_eagle3(train_target, data, cfg, work_dir=tmp_path / "b", progress=False, stop_after=2)
    resumed = train_eagle3(train_target, data, dataclasses.replace(cfg, init_head=str(folder)), work_dir=tmp_path / "b",
                           progress=False)
    for key, value in straight.head.state_dict().items():
        assert torch.equal(resumed.head.state_dict()[key], value), key


def test_an_mtp_warm_start_begins_at_the_saved_head(train_target, data, tmp_path):
    tiny = dict(ttt_steps=2, batch_tokens=512, log_every=1, val_every=100, val_fraction=0.1, val_batches=2)
    first = train_mtp(train_target, data, TrainConfig(max_steps=3, lr=3e-3, warmup_steps=1, **tiny), work_dir=tmp_path / "a",
                      progress=False)
    save_mtp(first.head.cpu(), tmp_path / "head")
    warm = train_mtp(train_target, data, TrainConfig(max_steps=1, init_head=str(tmp_path / "head"), **tiny, **STILL),
                     work_dir=tmp_path / "b", progress=False)
    for key, value in first.head.state_dict().items():
        torch.testing.assert_close(warm.head.state_dict()[key].cpu(), value.cpu(), rtol=0, atol=1e-6, msg=key)


def test_mtp_training_refuses_more_draft_layers(train_target, data, tmp_path):
    with pytest.raises(ValueError, match=r"draft_layers=2 is out of range for an MTP head; allowed: 1"):
        train_mtp(train_target, data, TrainConfig(max_steps=1, draft_layers=2, ttt_steps=2, batch_tokens=512),
                  work_dir=tmp_path, progress=False)


def test_the_command_line_names_a_missing_init_head(tmp_path, capsys):
    with pytest.raises(SystemExit, match=r"--init-head .*nohead: no head there"):
        main(["eagle3", "--target", "smollm2", "--out", str(tmp_path / "o"), "--init-head", str(tmp_path / "nohead")])


@pytest.mark.parametrize("kind, layers, allowed", [("eagle3", "0", "an int >= 1"),
                                                   ("mtp", "2", r"1 \(an MTP head is one module\)")])
def test_the_command_line_names_a_bad_draft_layer_count(tmp_path, kind, layers, allowed):
    with pytest.raises(SystemExit, match=rf"--draft-layers {layers} is out of range for {kind}; allowed: {allowed}"):
        main([kind, "--target", "smollm2", "--out", str(tmp_path / "o"), "--draft-layers", layers])


def test_the_command_line_goes_on_from_a_finished_head(train_target, tmp_path):
    from specdec.drafters.eagle3_checkpoint import load_eagle3

    def argv(out, work, seed, *extra):
        return ["eagle3", "--target", str(train_target.path), "--out", str(out), "--work", str(work), "--seed", str(seed),
                "--num-prompts", "16", "--roots", "stdlib", "--max-new-tokens", "8", "--max-prompt-tokens", "160",
                "--gen-batch-size", "8", "--draft-vocab-size", "48", "--steps", "2", "--batch-tokens", "1024",
                "--ttt-steps", "2", "--log-every", "1", "--val-every", "2", *extra]

    assert main(argv(tmp_path / "first", tmp_path / "w1", 0)) == 0
    # the next session: other prompts (another seed), a new work folder, the first head to start from
    assert main(argv(tmp_path / "second", tmp_path / "w2", 1, "--init-head", str(tmp_path / "first"),
                     "--draft-layers", "2")) == 0
    first, second = load_eagle3(tmp_path / "first"), load_eagle3(tmp_path / "second")
    assert (first.config.num_layers, second.config.num_layers) == (1, 2)  # deepened on the way
    assert torch.equal(first.d2t, second.d2t)  # the first head's draft vocabulary, kept
    assert not torch.equal(first.fc.weight, second.fc.weight)  # and trained on
    record = (tmp_path / "second" / "TRAINING.md").read_text()
    assert f'"init_head": "{tmp_path / "first"}"' in record and "--init-head" in record
    assert "draft layers: 2" in record


def test_the_command_line_deepens_a_head_that_drafts_the_same(tmp_path, capsys):
    """`deepen`: the saved deeper head (bf16 by default) has the old layers bit for bit and gives
    the same logits as the old head (new layers are identities); fewer layers are refused."""
    from specdec.drafters.draft_attention import causal_attend
    from specdec.drafters.eagle3_checkpoint import load_eagle3

    from _eagle3_heads import random_head

    head = random_head(seed=6)
    save_eagle3(head, tmp_path / "one")
    assert main(["deepen", "--head", str(tmp_path / "one"), "--layers", "2", "--out", str(tmp_path / "two"),
                 "--dtype", "float32"]) == 0
    assert "2 draft layers (1 from" in capsys.readouterr().out
    two = load_eagle3(tmp_path / "two")
    assert two.config.num_layers == 2
    g = torch.Generator().manual_seed(0)
    emb, hidden = torch.randn(1, 5, 32, generator=g), torch.randn(1, 5, 96, generator=g)
    pos = torch.arange(5)[None]
    attend = causal_attend(head.config.head_dim**-0.5)
    with torch.no_grad():
        assert torch.equal(head(emb, hidden, pos, attend, first_step=True)[1],
                           two(emb, hidden, pos, [attend, attend], first_step=True)[1])
    with pytest.raises(SystemExit, match=r"--layers 2 is out of range: .* has 2 draft layers; allowed: more than 2"):
        main(["deepen", "--head", str(tmp_path / "two"), "--layers", "2", "--out", str(tmp_path / "x")])
