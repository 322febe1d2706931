#!/usr/bin/env bash
# Install fhirgym with its test extras into ./.venv and run the whole test suite (lint included).
# This is exactly what CI runs (.ci/run). Works on a fresh machine with Python >= 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
source scripts/_chromium.sh && ensure_chromium
install_fhirgym ".[test]"
.venv/bin/ruff check src tests bench
.venv/bin/python -m pytest -q "$@"
