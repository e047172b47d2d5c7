"""The per-category evaluation (`python -m specdec.train eval`) with the drafter's setups optionally run
eagerly (no torch.compile, no CUDA graphs), so that CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer name the
kernel that fails. Twenty-second session: `calls.sh eval-gpu` (MTP tree D=6 K=8 N=48, float32, batch
16) stopped with an illegal memory access on the H100.

    python notes/gpu/issue21/crash/tree_eval.py [--eager] -- <specdec.train eval flags>
"""
import sys

from specdec.train import cli, evaluate

argv = sys.argv[1:]
eager = "--eager" in argv
no_graphs = "--no-graphs" in argv  # compiled, not captured
argv = [a for a in argv if a not in ("--eager", "--no-graphs", "--")]
if no_graphs:
    for setups in evaluate.DRAFTER_SETUPS.values():
        for key, (name, config) in list(setups.items()):
            setups[key] = (name + " no-graphs", config.replace(cuda_graphs=False))
if eager:
    for setups in evaluate.DRAFTER_SETUPS.values():
        for key, (name, config) in list(setups.items()):
            setups[key] = (name + " eager", config.replace(compile=False, cuda_graphs=False))
    name, config = evaluate.TARGET_ONLY
    evaluate.TARGET_ONLY = (name + " eager", config.replace(compile=False, cuda_graphs=False))
sys.exit(cli.main(["eval", *argv]))
