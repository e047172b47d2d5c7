#!/usr/bin/env bash
# Install what the demo needs (first run), then run it on the CPU.
source "$(dirname "$0")/env.sh"
exec python examples/demo.py "$@"
