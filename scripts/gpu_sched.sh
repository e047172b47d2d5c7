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
