# Shared by the README's commands: create ./.venv and install fhirgym into it (quietly, failing loudly).
PY=${PYTHON:-python3}
install_fhirgym() {
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  local log
  log=$(mktemp)
  if ! .venv/bin/python -m pip install --disable-pip-version-check -q -e "$1" >"$log" 2>&1; then
    cat "$log" >&2
    echo "pip install -e '$1' failed" >&2
    exit 1
  fi
  rm -f "$log"
}
