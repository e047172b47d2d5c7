#!/usr/bin/env bash
# Install what the tests need (first run), then run the whole suite on the CPU.
# Triton kernels run under the interpreter; hypothesis uses the derandomized `ci` profile.
source "$(dirname "$0")/env.sh"
export TRITON_INTERPRET=1 HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
exec python -m pytest -q "$@"
