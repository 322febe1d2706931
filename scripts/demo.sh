#!/usr/bin/env bash
# Install fhirgym into ./.venv and serve the embedded FHIR server with a seeded demo world.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
install_fhirgym "."
exec .venv/bin/fhirgym serve --demo "$@"
