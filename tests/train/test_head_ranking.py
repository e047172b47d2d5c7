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
