"""scripts/head_ranking.py's counting: where the head ranks the target's argmax, and its misses."""
import importlib.util
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "head_ranking.py"


def _script():
    spec = importlib.util.spec_from_file_location("head_ranking", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("head_ranking", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


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


def test_mtp_depth1_row_t_is_the_head_after_x_t_plus_1_predicting_x_t_plus_2(tmp_path):
    """Row t of `mtp_depth1_logits` is what the MTP head drafts at depth 1 after the context
    x_0..x_{t+1} (its step 0 on the target's last hidden state at t and x_{t+1}), beside the
    target's distribution of x_{t+2}: the full sequence's row t equals the last row of a run on
    that prefix alone (causal, and no off-by-one), and tokens outside the draft vocabulary get -inf."""
    from _mtp_heads import random_mtp
    from _tiny_models import make_checkpoint

    from specdec.models import load_target
    from specdec.train.teacher import dense_forward

    make_checkpoint("llama", tmp_path, num_hidden_layers=2, vocab_size=96)
    target = load_target(tmp_path, dtype=torch.float32)
    head = random_mtp(seed=3)
    tokens = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    ranking = _script()
    with torch.no_grad():
        logits, probs = ranking.mtp_depth1_logits(head, target, tokens, None)
        assert logits.shape == probs.shape == (10, 96)
        for t in (0, 4, 9):
            prefix = tokens[:, : t + 2]  # x_0..x_{t+1}
            _, last = dense_forward(target.model, prefix, (len(target.model.layers) - 1,))
            _, alone = head.sequence_forward(last, target.model.embed(torch.cat([prefix[:, 1:], prefix[:, -1:]], 1)),
                                             head=target.model.lm_head)  # the last row pairs h_{t+1} with a dummy
            torch.testing.assert_close(logits[t], alone[0, t].float(), rtol=1e-5, atol=1e-5)
            _, with_next = dense_forward(target.model, tokens[:, : t + 2], (len(target.model.layers) - 1,))
            want = torch.softmax(target.model.lm_head(with_next[0, t + 1]).float(), -1)  # the target's x_{t+2}
            torch.testing.assert_close(probs[t], want, rtol=1e-5, atol=1e-6)
        ids = torch.tensor([3, 17, 40, 95])
        masked, _ = ranking.mtp_depth1_logits(head, target, tokens, ids)
    assert torch.isinf(masked).sum() == 10 * (96 - 4)
    torch.testing.assert_close(masked[:, ids], logits[:, ids])
