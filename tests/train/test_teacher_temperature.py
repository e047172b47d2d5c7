"""The teacher temperature of the unroll's loss (`--teacher-temperature`): 1 is the target's own
distribution (every head so far), below 1 sharper toward the argmax greedy verification accepts,
0 the argmax alone; both unrolls (EAGLE-3 and MTP) train on exactly that target."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.train.cli import _parser, _train_config
from specdec.train.mtp_unroll import mtp_teacher_forward, mtp_unroll
from specdec.train.trainer import TrainConfig
from specdec.train.ttt import teacher_distribution, ttt_unroll

from _eagle3_heads import D_T, V, VD, random_head
from _mtp_heads import random_mtp
from _train_tiny import one_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@settings(deadline=None, max_examples=40)
@given(rows=st.integers(1, 6), vocab=st.integers(2, 40), temperature=st.floats(0.05, 4.0), seed=st.integers(0, 2**16))
def test_the_teacher_distribution_is_the_softmax_of_the_scaled_logits(rows, vocab, temperature, seed):
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    p = teacher_distribution(logits, temperature)
    assert p.dtype == torch.float32
    torch.testing.assert_close(p, torch.softmax(logits.float() / temperature, -1), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(p.sum(-1), torch.ones(rows), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(teacher_distribution(logits), torch.softmax(logits.float(), -1))
    # the argmax keeps its place, and a lower temperature only gives it more mass
    assert torch.equal(p.argmax(-1), logits.argmax(-1))
    sharper = teacher_distribution(logits, temperature / 2)
    top = logits.argmax(-1, keepdim=True)
    assert bool((sharper.gather(-1, top) >= p.gather(-1, top) - 1e-6).all())


def test_temperature_zero_is_the_one_hot_argmax_and_the_limit_of_small_temperatures():
    logits = torch.tensor([[0.0, 2.0, 1.9, -1.0], [3.0, 3.0, 0.0, 0.0]])
    hard = teacher_distribution(logits, 0.0)
    assert hard.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]  # a tie goes to the first index
    torch.testing.assert_close(teacher_distribution(logits[:1], 1e-3), hard[:1])


@pytest.mark.parametrize("bad", [-0.5, -1e-9, math.nan])
def test_a_temperature_out_of_range_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=r"teacher temperature .* allowed: >= 0"):
        teacher_distribution(torch.zeros(2, 3), bad)
    with pytest.raises(ValueError, match=r"teacher_temperature=.* allowed: finite >= 0"):
        TrainConfig(teacher_temperature=bad)
    with pytest.raises(ValueError, match=r"teacher_temperature=inf"):
        TrainConfig(teacher_temperature=math.inf)


def _eagle3_case(seed: int = 0):
    head = random_head(seed=seed)
    embed = torch.nn.Embedding(V, D_T)
    B, T = 2, 10
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    captured = torch.randn(B, T, 3 * D_T, generator=gen)
    logits = torch.randn(B, T, VD, generator=gen)  # [B, T, Vd]
    argmax = head.target_ids()[logits.argmax(-1)]  # [B, T] every argmax a draft token
    return head, embed, tokens, captured, logits, argmax


@pytest.mark.parametrize("temperature", [0.0, 0.5])
def test_the_eagle3_unroll_trains_on_the_tempered_target(temperature):
    """Temperature t on logits z is temperature 1 on z / t; temperature 0 is temperature 1 on
    logits so far apart that their softmax is exactly the one-hot argmax."""
    head, embed, tokens, captured, logits, argmax = _eagle3_case()
    scaled = logits * 1e6 if temperature == 0 else logits / temperature
    rest = (argmax, torch.ones(2, 10), torch.ones(2, 10, dtype=torch.bool))
    with torch.no_grad():
        tempered = ttt_unroll(head, embed, captured, tokens, logits, *rest, steps=3, teacher_temperature=temperature)
        same = ttt_unroll(head, embed, captured, tokens, scaled, *rest, steps=3)
        plain = ttt_unroll(head, embed, captured, tokens, logits, *rest, steps=3)
    torch.testing.assert_close(tempered.step_loss, same.step_loss)
    assert not torch.allclose(tempered.step_loss, plain.step_loss)
    assert torch.equal(tempered.correct, plain.correct)  # accuracy is the argmax's, whatever the loss's target
    if temperature == 0:  # the hard target's loss is the cross-entropy of the argmax's draft token
        seen = []
        hook = head.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
        with torch.no_grad():
            ttt_unroll(head, embed, captured, tokens, logits, *rest, steps=1, teacher_temperature=0.0)
        hook.remove()
        draft_logp = torch.log_softmax(seen[0][:, :8].float(), -1)  # [B, 8, Vd]: step 0 predicts x_{t+2}
        expected = -draft_logp.gather(-1, logits[:, 1:9].argmax(-1, keepdim=True)).mean()
        torch.testing.assert_close(tempered.step_loss[0], expected)


def test_the_mtp_unroll_trains_on_the_tempered_target(train_target):
    model = random_mtp(seed=2)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (2, 10), generator=gen)
    with torch.no_grad():
        teacher = mtp_teacher_forward(train_target.model, tokens)
    embed, lm_head = train_target.model.embed, train_target.model.lm_head
    rest = (teacher.argmax, torch.ones(2, 10), torch.ones(2, 10, dtype=torch.bool))
    with torch.no_grad():
        hard = mtp_unroll(model, embed, lm_head, teacher.last_hidden, tokens, teacher.logits, *rest, steps=3,
                          recompute=False, teacher_temperature=0.0)
        same = mtp_unroll(model, embed, lm_head, teacher.last_hidden, tokens, teacher.logits * 1e6, *rest, steps=3,
                          recompute=False)
        plain = mtp_unroll(model, embed, lm_head, teacher.last_hidden, tokens, teacher.logits, *rest, steps=3,
                           recompute=False)
    torch.testing.assert_close(hard.step_loss, same.step_loss)
    assert not torch.allclose(hard.step_loss, plain.step_loss)


def test_the_command_line_flag_reaches_the_training_config():
    base = ["eagle3", "--target", "smollm2", "--out", "x"]
    assert _train_config(_parser().parse_args(base)).teacher_temperature == 1.0
    cfg = _train_config(_parser().parse_args([*base, "--teacher-temperature", "0.25"]))
    assert cfg.teacher_temperature == 0.25
    with pytest.raises(ValueError, match=r"teacher_temperature=-1\.0"):
        _train_config(_parser().parse_args([*base, "--teacher-temperature", "-1"]))
