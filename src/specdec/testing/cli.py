"""`specdec check [NAME ...]` / `python -m specdec.testing`: run the conformance kit against
installed strategies and print a pass/fail table (a row per property, as it finishes).

NAME is any strategy name a plugin declares (a drafter, a verifier or a tree policy, built-in
or third party), or `build-tree` / `relocate-kv` for the resolved tree builder and KV
relocator; no NAME checks everything installed. Exit status 1 when a property fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from ..config import SpecConfig
from ..registry import get_plugin_manager, resolve_tree_policy, strategy_names, verifier_caps
from .profiles import PROFILES

if TYPE_CHECKING:
    from .kit import Subject

__all__ = ["main", "subjects", "check", "add_arguments", "run_args", "PROFILES"]

SPECIAL = {"build-tree": "tree-builder", "relocate-kv": "relocator"}
KINDS = {"drafter": "drafter", "verifier": "verifier", "tree": "tree-policy"}
POLICY_DEFAULTS = {"dynamic": dict(topk=2), "sampled": dict(topk=2)}  # a valid config to build one from


def subjects(names, pm, config: dict, options: dict) -> list[Subject]:
    """One `Subject` per (name, kind); unknown names are a ValueError listing the known ones."""
    from .kit import Subject  # here, not at the top: kit imports hypothesis and torch, the flags need neither

    declared = strategy_names(pm)
    by_name: dict[str, list[str]] = {}
    for kind, kind_names in declared.items():
        for name in kind_names:
            if kind in KINDS:
                by_name.setdefault(name, []).append(KINDS[kind])
    for name, kind in SPECIAL.items():
        by_name[name] = [kind]
    names = list(names) or list(by_name)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown strategy names {unknown}; installed: {sorted(by_name)}")
    out = []
    for name in names:
        for kind in by_name[name]:
            subject = Subject(name, kind, pm=pm, config=dict(config), options=dict(options))
            base = dict(config, plugin_options=options)
            if kind == "verifier":
                subject.obj = pm.hook.specdec_verify(config=SpecConfig(**{**base, "verifier": name}))
                subject.caps = verifier_caps(subject.obj)
            elif kind == "tree-policy":
                subject.obj = resolve_tree_policy(SpecConfig(**{**POLICY_DEFAULTS.get(name, {}), **base, "tree": name}), pm=pm)
            elif kind == "tree-builder":
                subject.obj = pm.hook.specdec_build_tree(config=SpecConfig(**base))
            elif kind == "relocator":
                depth = 11
                subject.obj = pm.hook.specdec_relocate_kv(config=SpecConfig(**{**base, "max_draft_len": depth, "max_seq_len": 64}))
                subject.caps = depth + 1  # the path entries it must read
            out.append(subject)
    return out


def check(names=(), *, device="cpu", profile="ci", config=None, options=None, pm=None, scale=1.0, out=None, only=None,
          shrink=True):
    """Run the kit; print a row per property as it finishes. Returns the `Result`s.

    `only`: run only properties whose name contains this text; `out`: where the table goes
    (default: sys.stdout at call time); `shrink=False` reports a failure as first found.
    """
    import torch  # here, not at the top (nor kit, suite): `specdec check --help` imports neither torch nor hypothesis

    from .kit import Context, run_property
    from .suite import properties_for

    pm = pm or get_plugin_manager()
    out = out or sys.stdout
    ctx = Context(device=torch.device(device), profile=profile, scale=scale, shrink=shrink)
    todo = [(s, p) for s in subjects(names, pm, config or {}, options or {}) for p in properties_for(s) if only is None or only in p.name]
    width = max([len(p.name) for _, p in todo] + [8])
    header = f"{'strategy':<14} {'kind':<12} {'property':<{width}} {'examples':>8} {'seconds':>8}  result"
    print(header, file=out, flush=True)
    print("-" * len(header), file=out, flush=True)
    results = []
    for subject, prop in todo:
        r = run_property(prop, subject, ctx)
        results.append(r)
        verdict = "PASS" if r.ok else f"FAIL  {r.error[:200]}"
        print(f"{r.subject:<14} {r.kind:<12} {r.prop:<{width}} {r.examples:>8} {r.seconds:>8.1f}  {verdict}", file=out, flush=True)
    failed = [r for r in results if not r.ok]
    total = sum(r.seconds for r in results)
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed in {total:.1f} s ({profile} profile, {device})", file=out, flush=True)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME", help="strategy names (default: every installed one)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--profile", default="ci", choices=PROFILES, help="ci: few derandomized examples; gpu: many")
    parser.add_argument("--config", default="{}", help="SpecConfig fields as JSON, e.g. '{\"max_draft_len\": 4}'")
    parser.add_argument("--plugin-options", default="{}", help="SpecConfig.plugin_options as JSON")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every property's example count")
    parser.add_argument("--no-shrink", dest="shrink", action="store_false", help="report a failure as first found (faster)")
    parser.add_argument("-k", dest="only", default=None, help="only properties whose name contains this text")


def run_args(args) -> int:
    """Run the kit for parsed `add_arguments` flags; exit status 0 all passed, 1 a failure, 2 bad input."""
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        print("specdec check needs hypothesis: pip install hypothesis", file=sys.stderr)
        return 2
    try:
        config, options = json.loads(args.config), json.loads(args.plugin_options)
    except json.JSONDecodeError as err:
        print(f"--config / --plugin-options must be JSON: {err}", file=sys.stderr)
        return 2
    try:
        results = check(args.names, device=args.device, profile=args.profile, config=config, options=options,
                        scale=args.scale, only=args.only, shrink=args.shrink)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    return 0 if all(r.ok for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run_args(parser.parse_args(sys.argv[1:] if argv is None else argv))
