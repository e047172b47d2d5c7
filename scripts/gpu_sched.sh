# Sourced by gpu_props.sh and gpu_check.sh: how their pytest -n 8 runs hand out tests.
# SPECDEC_TEST_ORDER: tests/_timebox.py orders the collected tests longest first by the
# durations in tests/gpu_durations.json (refresh with scripts/gpu_durations.py after a run).
# `sched`: --dist loadgroup, under which every test without an xdist_group is its own work
# unit and the first units go one per worker, round robin (the slowest properties start at
# once on separate workers), then one unit at a time to whichever worker runs short. Under
# --dist load each worker first gets a chunk of neighbouring tests: at 0c679cb the kernels
# part's two longest properties (234 and 179 s) queued in one worker, 517 s of wall time for
# 1674 s of tests over 8 workers.
sched_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export SPECDEC_TEST_ORDER="$sched_root/tests/gpu_durations.json"
sched=(--dist loadgroup)
# CPU threads per pytest worker: the GPU host has 16 cores and a part runs 8 workers (two parts
# side by side, 16; GPU_PARTS_SIDE_BY_SIDE). torch's default is one OpenMP thread per core in
# every worker, and Inductor compiles with one process per core: 8-16 workers each spinning 16
# threads on CPU work (transformers' reference generate in test_smollm2.py, the six decoders'
# compiles in test_many_decoders.py) is the oversubscription that made those two tests take
# 383 s and 338 s in the tools part at a699352 (22 s and 81 s when they had the host nearly to
# themselves). Each worker gets its share of the cores instead.
sched_workers=$(( 8 * ${GPU_PARTS_SIDE_BY_SIDE:-1} ))
sched_threads=$(( $(nproc) / sched_workers )); [ "$sched_threads" -lt 1 ] && sched_threads=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$sched_threads}"
export TORCHINDUCTOR_COMPILE_THREADS="${TORCHINDUCTOR_COMPILE_THREADS:-$sched_threads}"
