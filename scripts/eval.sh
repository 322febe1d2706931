#!/usr/bin/env bash
# The main job: install fhirgym into ./.venv and evaluate the default agent (ReAct on the embedded
# Qwen2.5-Coder-1.5B) on the default task subset; prints the summary and writes runs/quickstart/report.html.
# Extra arguments go to `fhirgym eval` (e.g. --model openai/gpt-4.1-mini, --tasks all).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
install_fhirgym "."
exec .venv/bin/fhirgym eval --out "${FHIRGYM_OUT:-runs/quickstart}" --resume "$@"
