"""specdec_build_tree (placeholder until issue 3 lands; the helper writing issue 3 replaces this file)."""

from specdec.hookspecs import hookimpl


@hookimpl
def specdec_build_tree(config):
    raise NotImplementedError("specdec_build_tree waits for issue 3")
