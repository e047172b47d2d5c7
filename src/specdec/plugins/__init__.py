"""Built-in strategies, each a pluggy plugin module (registered by `get_plugin_manager`).

Write your own: a module with functions decorated by `specdec.hookimpl` and named like
the hooks in `specdec.hookspecs` (a named strategy's hooks by `specdec.strategy_hook(NAME)`,
which answers for that name only); declare your names in `specdec_strategy_names`
(`specdec.declared_names(hook, ...)` builds it); expose the module under the entry-point
group `specdec` in your package's pyproject:

    [project.entry-points.specdec]
    my_plugin = "my_package.my_module"

This package imports nothing: `BUILTIN_STRATEGY_NAMES` declares the names every built-in
answers to, so the CLI (`specdec plugins`, `--help`, name suggestions) lists them without
importing the plugin modules (and torch). The modules' own `specdec_strategy_names` hooks stay
what `specdec.registry.resolve` checks; a test keeps the two equal.
"""

BUILTIN_PLUGINS = (
    "specdec.plugins.none_drafter",  # drafter="none": target-only decoding (the baseline)
    "specdec.plugins.tree_policies",  # tree="linear" | "dynamic" | "static" | "sampled"
    "specdec.plugins.tree_builder",  # specdec_build_tree: parents -> TreeMeta
    "specdec.plugins.greedy",  # verifier="greedy"
    "specdec.plugins.target_only",  # verifier="target-only"
    "specdec.plugins.speculative",  # verifier="speculative"
    "specdec.plugins.relocate",  # specdec_relocate_kv: paged KV relocation
    "specdec.plugins.eagle3",  # drafter="eagle3": linear and dynamic-tree EAGLE-3 drafting
    "specdec.plugins.mtp",  # drafter="mtp": MTP-Eagle drafting from the target's last hidden state
    "specdec.plugins.ngram",  # drafter="ngram": model-free prompt lookup, chain or tree
    "specdec.plugins.typical",  # verifier="typical": Medusa typical acceptance (lossy)
)

# What each built-in's `specdec_strategy_names` hook answers, by kind, read without importing it.
BUILTIN_STRATEGY_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "specdec.plugins.none_drafter": {"drafter": ("none",)},
    "specdec.plugins.tree_policies": {"tree": ("linear", "dynamic", "static", "sampled")},
    "specdec.plugins.tree_builder": {},
    "specdec.plugins.greedy": {"verifier": ("greedy",)},
    "specdec.plugins.target_only": {"verifier": ("target-only",)},
    "specdec.plugins.speculative": {"verifier": ("speculative",)},
    "specdec.plugins.relocate": {},
    "specdec.plugins.eagle3": {"drafter": ("eagle3",)},
    "specdec.plugins.mtp": {"drafter": ("mtp",)},
    "specdec.plugins.ngram": {"drafter": ("ngram",)},
    "specdec.plugins.typical": {"verifier": ("typical",)},
}
assert tuple(BUILTIN_STRATEGY_NAMES) == BUILTIN_PLUGINS, "declare every built-in plugin, in registration order"
