"""scripts/head_ranking.py's counting: where the head ranks the target's argmax, and its misses."""
import torch

from _scripts import load_script


def _script():
    return load_script("head_ranking")


def test_rank_stats_count_hits_top_k_and_the_kind_of_each_miss():
    inf = float("inf")
    target = torch.tensor([
        [0.10, 0.60, 0.20, 0.05, 0.05],  # argmax 1; the head's top-1: a hit
        [0.45, 0.40, 0.10, 0.05, 0.00],  # argmax 0, unsure; the head ranks it third and took the target's 2nd
        [0.12, 0.05, 0.05, 0.08, 0.70],  # argmax 4, sure, outside the draft vocabulary; the head took the 2nd
    ])
    head = torch.tensor([
        [0.0, 5.0, 1.0, -inf, -inf],
        [1.0, 3.0, 2.0, 0.0, -inf],
        [2.0, 0.0, 0.5, 1.0, -inf],
    ])
    stats = _script().RankStats()
    stats.add(head, target)
    assert stats.positions == 3
    assert stats.in_top == {1: 1, 2: 1, 4: 2, 8: 2}  # an argmax outside the draft vocabulary is never in reach
    assert (stats.misses, stats.misses_target_sure, stats.misses_head_took_target_second) == (2, 1, 2)
    assert stats.row("x") == "| x | 3 | 0.33 | 0.33 | 0.67 | 0.67 | 0.50 | 1.00 |"
    stats.add(head[:1], target[:1])  # counts add up over calls
    assert stats.positions == 4 and stats.in_top[1] == 2 and stats.misses == 2
    total = _script().RankStats()
    total.merge(stats)
    total.merge(stats)  # the "all" row: categories' counts summed
    assert total.positions == 8 and total.in_top == {1: 4, 2: 4, 4: 6, 8: 6}
    assert (total.misses, total.misses_target_sure, total.misses_head_took_target_second) == (4, 2, 4)


def _tiny_target(tmp_path, layers: int):
    from _tiny_models import make_checkpoint

    from specdec.models import load_target

    make_checkpoint("llama", tmp_path, num_hidden_layers=layers, vocab_size=96)
    return load_target(tmp_path, dtype=torch.float32)


def _top1_hits(per_depth, probs) -> list[int]:
    """Per depth, the rows whose top-1 is the target's argmax (and a draft token), as RankStats counts them."""
    ranking = _script()
    hits = []
    for k, logits in enumerate(per_depth):
        stats = ranking.RankStats()
        stats.add(logits, probs[k + 1 : k + 1 + logits.shape[0]])
        hits.append(stats.in_top[1])
    return hits


def test_mtp_depth_1_row_t_is_the_head_after_x_t_plus_1_predicting_x_t_plus_2(tmp_path):
    """Row t of depth 1 is what the MTP head drafts after the context x_0..x_{t+1} (its step 0 on
    the target's last hidden state at t and x_{t+1}), beside the target's distribution of x_{t+2}
    (probs row t + 1): the full sequence's row t equals the last row of a run on that prefix alone
    (causal, no off-by-one); tokens outside the draft vocabulary get -inf."""
    from _mtp_heads import random_mtp

    from specdec.train.teacher import dense_forward

    target = _tiny_target(tmp_path, 2)
    head = random_mtp(seed=3)
    tokens = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    ranking = _script()
    with torch.no_grad():
        per_depth, probs = ranking.mtp_depth_logits(head, target, tokens, None, depths=3)
        assert [x.shape for x in per_depth] == [(10, 96), (9, 96), (8, 96)] and probs.shape == (12, 96)
        for t in (0, 4, 9):
            prefix = tokens[:, : t + 2]  # x_0..x_{t+1}
            _, last = dense_forward(target.model, prefix, (len(target.model.layers) - 1,))
            _, alone = head.sequence_forward(last, target.model.embed(torch.cat([prefix[:, 1:], prefix[:, -1:]], 1)),
                                             head=target.model.lm_head)  # the last row pairs h_{t+1} with a dummy
            torch.testing.assert_close(per_depth[0][t], alone[0, t].float(), rtol=1e-5, atol=1e-5)
            want = torch.softmax(target.model.lm_head(last[0, t + 1]).float(), -1)  # the target's x_{t+2}
            torch.testing.assert_close(probs[t + 1], want, rtol=1e-5, atol=1e-6)
        ids = torch.tensor([3, 17, 40, 95])
        masked, _ = ranking.mtp_depth_logits(head, target, tokens, ids, depths=1)
    assert torch.isinf(masked[0]).sum() == 10 * (96 - 4)
    torch.testing.assert_close(masked[0][:, ids], per_depth[0][:, ids])


def test_mtp_depths_count_the_top_1_hits_the_training_unroll_counts(tmp_path):
    """Each depth's top-1 hits equal `mtp_unroll`'s per-step matches on the same sequence (the
    trainer's own indexing and attention): depth k is the unroll's step k - 1."""
    from _mtp_heads import random_mtp

    from specdec.train.mtp_unroll import mtp_teacher_forward, mtp_unroll

    target = _tiny_target(tmp_path, 2)
    head = random_mtp(seed=5)
    tokens = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        per_depth, probs = _script().mtp_depth_logits(head, target, tokens, None, depths=4)
        teacher = mtp_teacher_forward(target.model, tokens)
        ones = torch.ones(1, 20)
        result = mtp_unroll(head, target.model.embed, target.model.lm_head, teacher.last_hidden, tokens, teacher.logits,
                            teacher.argmax, ones, ones.bool(), steps=4, recompute=False)
    assert _top1_hits(per_depth, probs) == result.correct.long().tolist()
    assert result.count.long().tolist() == [x.shape[0] for x in per_depth]
    assert sum(result.correct.long().tolist()) > 0  # a comparison of hits, not of zeros


def test_eagle3_depths_count_the_top_1_hits_the_training_unroll_counts(tmp_path):
    """As for MTP, against `ttt_unroll` (EAGLE-3's TTT, draft vocabulary): depth k is TTT step k - 1."""
    from _eagle3_heads import random_head

    from specdec.train.teacher import dense_forward
    from specdec.train.ttt import ttt_unroll

    target = _tiny_target(tmp_path, 3)
    head = random_head(seed=2, hidden_size=64, target_hidden_size=64, head_dim=16, capture_layers=(0, 1, 2), std=0.3)
    tokens = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        per_depth, probs = _script().eagle3_depth_logits(head, target, tokens, depths=4)
        captured, last = dense_forward(target.model, tokens, (0, 1, 2))
        full = target.model.lm_head(last).float()  # [1, T, V]
        ones = torch.ones(1, 20)
        result = ttt_unroll(head, target.model.embed, captured, tokens, full[..., head.target_ids()], full.argmax(-1),
                            ones, ones.bool(), steps=4)
    assert [x.shape for x in per_depth] == [(18, 96), (17, 96), (16, 96), (15, 96)]
    assert torch.isinf(per_depth[0][0]).sum() == 96 - head.target_ids().shape[0]  # outside the draft vocabulary
    assert _top1_hits(per_depth, probs) == result.correct.long().tolist()
    assert sum(result.correct.long().tolist()) > 0  # a comparison of hits, not of zeros
