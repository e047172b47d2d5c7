#!/usr/bin/env bash
# Install what the tests need (first run), then run the whole suite on the CPU.
# Triton kernels run under the interpreter; hypothesis uses the derandomized `ci` profile.
# One pytest worker per core (pytest-xdist), whole files per worker (module fixtures are
# built once); SPECDEC_TEST_WORKERS=0 runs everything in this process.
source "$(dirname "$0")/env.sh"
export TRITON_INTERPRET=1 HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
workers="${SPECDEC_TEST_WORKERS:-$(nproc)}"
exec python -m pytest -q -n "$workers" --dist loadfile "$@"
