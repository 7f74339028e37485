#!/usr/bin/env bash
# README test command: set up .venv (see .ci/setup), then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup
exec .venv/bin/python -m pytest -ra "$@"
