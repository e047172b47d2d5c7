"""Training data: the held-out split, deterministic prompts, the draft vocabulary, batching,
batched self-distillation and the dense teacher forward."""

import pytest
import torch

from specdec.drafters.eagle3_checkpoint import validate_vocab_map
from specdec.models import CaptureBuffer, load_target
from specdec.train.data import collate, epoch_batches, split_validation
from specdec.train.distill import DistillData, generate_responses
from specdec.train.prompts import (
    Prompt,
    _excluded_from_training,
    discover_sources,
    encode_prompt,
    frozen_heldout_prompts,
    heldout_prompts,
    is_heldout,
    sample_prompts,
)
from specdec.train.teacher import teacher_forward
from specdec.train.vocab import build_vocab_map, coverage, token_counts

from _tiny_models import make_checkpoint, run_prefill, spec_config
from _train_tiny import one_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


# --------------------------------------------------------------------------- prompts
def test_prompt_split_keeps_heldout_files_out_of_training():
    files = discover_sources(("stdlib",))
    held = {f.id for f in files if is_heldout(f.id)}
    assert 0 < len(held) < len(files) // 4  # ~10% of the files, decided by the path alone
    train = sample_prompts(150, 0, roots=("stdlib",))
    evals = heldout_prompts(60, 0, roots=("stdlib",))
    assert len(train) == 150 and len(evals) == 60
    assert not any(is_heldout(p.source) for p in train)
    assert all(is_heldout(p.source) for p in evals)
    assert not {p.source for p in train} & {p.source for p in evals}
    frozen = frozen_heldout_prompts()
    assert len(frozen) == 64 and all(is_heldout(p.source) for p in frozen)
    assert sum(p.chat for p in frozen) == 32  # half code completion, half chat
    held_rel = sorted(f.id.split(":", 1)[1] for f in files if f.id in held)[0]
    assert _excluded_from_training(f"site:vendor/_stdlib/{held_rel}")  # a vendored copy of a held-out file
    other = "site:vendor/_stdlib/no_such_module_xyz.py"
    assert _excluded_from_training(other) == is_heldout(other)


def test_prompts_are_deterministic_in_the_seed_and_cover_every_kind():
    a = sample_prompts(80, 3, roots=("stdlib",))
    assert a == sample_prompts(80, 3, roots=("stdlib",))
    assert a != sample_prompts(80, 4, roots=("stdlib",))
    kinds = {p.kind for p in a}
    assert {"code", "task", "general"} <= kinds and kinds - {"code", "task", "general"}  # + code questions
    assert all(not p.chat for p in a if p.kind == "code") and all(p.chat for p in a if p.kind != "code")
    assert len({p.text for p in a}) == len(a)
    with pytest.raises(ValueError, match="split"):
        sample_prompts(3, split="test")


def test_frozen_prompts_alternate_code_and_chat():
    assert [p.chat for p in frozen_heldout_prompts(4)] == [False, True, False, True]
    with pytest.raises(ValueError, match="allowed"):
        frozen_heldout_prompts(65)


def test_chat_prompts_go_through_the_chat_template():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            assert add_generation_prompt and not tokenize
            return f"<u>{messages[0]['content']}</u><a>"

        def __call__(self, text, add_special_tokens):
            assert not add_special_tokens
            return {"input_ids": [ord(c) for c in text]}

    chat = encode_prompt(Prompt("task", "list:x", "hi", True), Tok())
    assert "".join(map(chr, chat)) == "<u>hi</u><a>"
    assert encode_prompt(Prompt("code", "s:a.py", "def f", False), Tok()) == [ord(c) for c in "def f"]
    assert encode_prompt(Prompt("code", "s:a.py", "ab", False), None, vocab_size=96) == [97 % 96, 98 % 96]


# --------------------------------------------------------------------------- vocabulary
def test_draft_vocabulary_is_the_most_frequent_targets_as_an_injective_map():
    seqs = [torch.tensor([9, 5, 5, 5, 7, 7, 3]), torch.tensor([1, 2, 7, 3, 3])]
    data = DistillData.pack(seqs, [1, 2], ["code", "task"])
    counts = token_counts(data, 10, prompt_weight=0.0)  # response tokens only
    assert counts.tolist() == [0, 0, 0, 3, 0, 3, 0, 3, 0, 0]
    d2t, t2d = build_vocab_map(counts, 4)  # 3, 5, 7 and, for the tie at 0, the lowest id 0
    assert (torch.arange(4) + d2t).tolist() == [0, 3, 5, 7]
    assert t2d.nonzero()[:, 0].tolist() == [0, 3, 5, 7]
    validate_vocab_map(d2t, t2d, 10)
    assert coverage(counts, t2d) == 1.0
    weighted = token_counts(data, 10, prompt_weight=0.5)  # prompt tokens after the first count half
    assert weighted[2] == 0.5 and weighted[9] == 0 and weighted[1] == 0
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_vocab_map(counts, 11)


# --------------------------------------------------------------------------- batches
def test_epoch_batches_cover_every_sequence_once_within_the_token_budget():
    lengths = [int(x) for x in torch.randint(3, 90, (57,), generator=torch.Generator().manual_seed(1))]
    batches = epoch_batches(lengths, 256, seed=0, epoch=2, max_len=80)
    assert sorted(i for b in batches for i in b) == list(range(57))
    for b in batches:
        width = max(-(-min(lengths[i], 80) // 16) * 16 for i in b)
        assert width * len(b) <= 256 or len(b) == 1
    assert batches == epoch_batches(lengths, 256, seed=0, epoch=2, max_len=80)
    assert batches != epoch_batches(lengths, 256, seed=0, epoch=3, max_len=80)
    train, val = split_validation(57, 0.1, seed=0)
    assert len(val) == 6 and sorted(train + val) == list(range(57))


def test_collate_pads_and_weights_prompt_and_response_tokens():
    data = DistillData.pack([torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6, 7, 8])], [2, 1], ["code", "task"])
    b = collate(data, [0, 1], max_len=4, prompt_weight=0.25, pad_multiple=4)
    assert b.tokens.tolist() == [[1, 2, 3, 4], [6, 7, 8, 0]]
    assert b.weights.tolist() == [[0, 0.25, 1, 1], [0, 1, 1, 0]]
    assert b.response.tolist() == [[False, False, True, True], [False, True, True, False]]
    assert b.lengths.tolist() == [4, 3]


# --------------------------------------------------------------------------- distillation
def test_batched_generation_equals_one_prompt_at_a_time(train_target, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the ops' torch references (kernels: own suites)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [3, 1], [40, 41, 42, 43], [2] * 11, [17, 18, 19]]
    batched = generate_responses(train_target.model, prompts, max_new_tokens=9, batch_size=3, eos_token_ids=(), progress=False)
    for p, out in zip(prompts, batched):
        alone = generate_responses(train_target.model, [p], max_new_tokens=9, batch_size=1, eos_token_ids=(), progress=False)
        assert out == alone[0] and len(out) == 9
    eos = batched[0][3]
    cut = generate_responses(train_target.model, prompts[:1], max_new_tokens=9, batch_size=1, eos_token_ids=(eos,), progress=False)
    assert cut[0] == batched[0][: batched[0].index(eos) + 1]  # ends after the first EOS, kept


def test_full_width_batches_for_a_cuda_graph_pad_with_copies_and_drop_them(train_target, monkeypatch):
    from specdec.train import distill

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the ops' torch references (kernels: own suites)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [3, 1], [40, 41, 42, 43], [2] * 11, [17, 18, 19]]
    plain = generate_responses(train_target.model, prompts, max_new_tokens=6, batch_size=4, eos_token_ids=(), progress=False)
    widths = []
    real_eager = distill._DecodeStep.eager

    def eager(self, tokens, cache_len):
        widths.append(tokens.shape[0])
        return real_eager(self, tokens, cache_len)

    monkeypatch.setattr(distill, "_can_graph", lambda device: True)  # as on CUDA, but without a graph:
    monkeypatch.setattr(distill._DecodeStep, "_capture", lambda self, tokens, cache_len: setattr(self, "tried", True))
    monkeypatch.setattr(distill._DecodeStep, "eager", eager)
    padded = generate_responses(train_target.model, prompts, max_new_tokens=6, batch_size=4, eos_token_ids=(),
                                progress=False, cuda_graph=True)
    assert padded == plain and set(widths) == {4}  # the last batch of 1 ran 4 wide


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_dense_teacher_forward_matches_the_paged_forward_with_capture(tmp_path, family):
    make_checkpoint(family, tmp_path, num_hidden_layers=4)
    model = load_target(tmp_path).model
    layers = (0, 2, 3)
    prompts = [list(range(3, 3 + 13)), [7, 1, 9, 4, 4, 2]]
    cache = model.make_cache(spec_config(max_batch_size=2, max_seq_len=32, block_size=4))
    capture = CaptureBuffer(layers, model.config.hidden_size, 64)
    out, q_len = run_prefill(model, cache, prompts, [0, 1], capture=capture)
    tokens = torch.zeros(2, 13, dtype=torch.int64)
    tokens[0] = torch.tensor(prompts[0])
    tokens[1, :6] = torch.tensor(prompts[1])
    draft_ids = torch.tensor([0, 5, 17, 40, 95])
    teacher = teacher_forward(model, tokens, layers, draft_ids)
    rows = capture.rows(19)
    torch.testing.assert_close(teacher.captured[0], rows[:13], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(teacher.captured[1, :6], rows[13:19], rtol=1e-4, atol=1e-4)
    for b, n in enumerate(q_len.tolist()):
        torch.testing.assert_close(teacher.logits[b, :n], out.logits[b, :n][:, draft_ids], rtol=1e-4, atol=1e-4)
        assert torch.equal(teacher.argmax[b, :n], out.logits[b, :n].argmax(-1))
