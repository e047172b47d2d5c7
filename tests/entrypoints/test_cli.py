"""The `specdec` command: one-line errors with exit code 2 before any weights load, every
config field as a flag with its default and description, the shipped aliases, chat by
default (`--raw` for completions), output labelled by prompt with a stats line each, and
answers equal to the library's. Runs `specdec.entrypoints.cli.main` in-process on a tiny target with a
chat template (`_chat_tokenizer`) and a random EAGLE-3 head."""

from __future__ import annotations

import dataclasses
import io
import re
from types import SimpleNamespace

import pytest

from specdec import SamplingParams, SpecConfig, SpecDecoder
from specdec.entrypoints.cli import _Printer, command, head_kind, resolve_draft
from specdec.models import load_target

from _cli_world import no_loading, run, tiny  # noqa: F401  (fixtures)
from _mtp_heads import e2e_cpu  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.usefixtures("e2e_cpu"),
              pytest.mark.filterwarnings("ignore:drafter='eagle3' accepts almost nothing:UserWarning")]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dtype", "float33"], r"argument --dtype: invalid choice: 'float33'"),
        (["--top-k", "abc"], r"argument --top-k: expected an int, got 'abc'"),
        (["--plugin-options", "{nope"], r"argument --plugin-options: expected a JSON object"),
        (["--compile", "maybe"], r"argument --compile: expected auto, true or false, got 'maybe'"),
        (["--temperature", "-1"], r"temperature=-1.0 is out of range; allowed: finite and >= 0"),
        (["--top-p", "2"], r"top_p=2.0 is out of range; allowed: \(0, 1\]"),
        (["--tree", "static", "--topk", "3"], r"topk=3 does not apply to tree='static'"),
        (["--temperature", "0.7", "--verifier", "greedy"], r"--temperature 0.7 needs a sampling verifier"),
        (["--verifier", "nope"], r"--verifier nope: not installed; available: .*target-only"),
        (["--device", "tpu"], r"device='tpu' is not a device|device='tpu' is not supported"),
        (["--draft", "/no/such/head"], r"--draft /no/such/head: no such folder; aliases: \['smollm2-eagle3', 'smollm2-mtp'\]"),
        (["--raw", "--system", "be brief"], r"--system applies to chat"),
    ],
)
def test_bad_flags_are_one_line_with_exit_code_2_before_any_weights_load(tiny, capsys, no_loading, flags, message):
    code, out, err = run(["generate", "--target", tiny.target, *flags, "w1"], capsys)
    assert code == 2
    assert re.search(message, err), err
    assert "Traceback" not in err and "usage:" not in err and len(err.strip().splitlines()) == 1


def test_a_missing_target_and_cuda_without_cuda_are_one_line_errors(capsys, no_loading):
    code, _, err = run(["generate", "--target", "/no/such/model", "w1"], capsys)
    assert code == 2 and "--target /no/such/model: no such file or folder; aliases: ['smollm2']" in err
    import torch

    if not torch.cuda.is_available():
        code, _, err = run(["generate", "--target", "/no/such/model", "--device", "cuda", "w1"], capsys)
        assert code == 2 and "device='cuda' needs CUDA" in err and len(err.strip().splitlines()) == 1


def test_errors_found_after_loading_are_one_line_too(tiny, capsys):
    code, _, err = run(["generate", "--target", tiny.target, "--drafter", "none", "--draft", tiny.head, "w1"], capsys)
    assert code == 2 and "runs no model and would ignore it" in err.splitlines()[-1]
    code, _, err = run(["generate", "--target", tiny.target, "--temperature", "0.5", "--top-k", "1000", "w1"], capsys)
    assert code == 2 and "top_k=1000 is out of range; allowed: [0, 96]" in err.splitlines()[-1]
    assert "Traceback" not in err


def test_help_shows_every_config_field_with_its_default_and_the_installed_strategies(capsys):
    code, out, _ = run(["generate", "--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    for name in [*SpecConfig().flat(), *(f.name for f in dataclasses.fields(SamplingParams))]:
        assert "--" + name.replace("_", "-") in text, name  # a part's fields by their flat names
    assert "installed: eagle3, mtp, ngram, none" in text
    assert "target-only" in text and "(default: 128)" in text and "(default: 2048)" in text
    assert ">= 0; 0 = greedy" in text  # the field's own description
    assert "smollm2-eagle3" in text and "--raw" in text


def test_generate_chats_by_default_streams_labelled_answers_and_prints_stats(tiny, capsys):
    code, out, err = run(["generate", "--target", tiny.target, "--draft", tiny.head, "--max-new-tokens", "6",
                          "--ignore-eos", "w1 w2", "w3"], capsys)
    assert code == 0, err
    target = load_target(tiny.target)
    dec = SpecDecoder.from_pretrained(target, tiny.head, SpecConfig(drafter="eagle3", max_batch_size=2))
    want = dec.chat([[{"role": "user", "content": p}] for p in ("w1 w2", "w3")],
                    SamplingParams(max_new_tokens=6, ignore_eos=True))
    assert out == f"\n[prompt 0] w1 w2\n{want[0].text}\n\n[prompt 1] w3\n{want[1].text}\n"
    assert "drafter=eagle3" in err  # inferred from the head
    lines = [line for line in err.splitlines() if line.startswith("[prompt")]
    assert len(lines) == 2
    assert re.fullmatch(r"\[prompt 0\] 6 tokens, [\d.]+ s, [\d.]+ tok/s, mean acceptance ([\d.]+ tokens/step|-), "
                        r"finish: length", lines[0])
    assert re.search(r"^total: 2 prompts, 12 tokens, [\d.]+ s, [\d.]+ tok/s$", err, re.M)


def test_raw_sends_a_completion(tiny, capsys):
    code, out, err = run(["generate", "--target", tiny.target, "--raw", "--max-new-tokens", "5", "--ignore-eos",
                          "--no-stream", "w1 w2"], capsys)
    assert code == 0, err
    dec = SpecDecoder.from_pretrained(load_target(tiny.target), None, SpecConfig(max_batch_size=1))
    assert out == dec.generate(["w1 w2"], SamplingParams(max_new_tokens=5, ignore_eos=True))[0].text + "\n"


def test_the_shipped_aliases_name_the_shipped_heads():
    for alias, kind in (("smollm2-eagle3", "eagle3"), ("smollm2-mtp", "mtp")):
        path, found = resolve_draft(alias)
        assert (path / "config.json").is_file() and found == kind and head_kind(path) == kind


def test_printer_keeps_prompt_order_when_later_prompts_finish_first():
    out = io.StringIO()
    printer = _Printer(["a", "b"], out)
    delta = SimpleNamespace
    printer.delta(delta(index=1, token_ids=[5], text="B1", finish_reason=None), 0.1)
    printer.delta(delta(index=0, token_ids=[3], text="A1", finish_reason=None), 0.1)
    assert out.getvalue() == "\n[prompt 0] a\nA1"  # prompt 1 is held back
    printer.delta(delta(index=1, token_ids=[6], text="B2", finish_reason="eos"), 0.2)
    printer.delta(delta(index=0, token_ids=[4], text="A2", finish_reason="length"), 0.3)
    assert out.getvalue() == "\n[prompt 0] a\nA1A2\n\n[prompt 1] b\nB1B2\n"


def test_a_subcommand_is_one_registered_function_and_names_are_unique():
    with pytest.raises(ValueError, match="registered twice"):
        command("generate", "again")(lambda args: 0)
