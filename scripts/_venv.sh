# Shared by the README's commands: create ./.venv and install fhirgym into it (quietly, failing loudly).
PY=${PYTHON:-python3}
source "$(dirname "${BASH_SOURCE[0]}")/_sandbox.sh"
# llama-cpp-python compiles llama.cpp from source. Leave out what its Python package never loads: the
# multimodal library and llama.cpp's `common` utilities (chat parsers, an HTTP client), more than half
# of the compile time. A CMAKE_ARGS of your own (e.g. for a GPU build) replaces this.
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$PWD/scripts/llama_cpp_minimal.cmake}"
install_fhirgym() {
  # The python tool's sandbox needs bubblewrap; without it that tool refuses to run (--unsafe-python aside).
  ensure_bwrap || echo "scripts/_venv.sh: bubblewrap is missing: the python tool's sandbox is unavailable" >&2
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  local log
  log=$(mktemp)
  if ! .venv/bin/python -m pip install --disable-pip-version-check -q -e "$1" >"$log" 2>&1; then
    cat "$log" >&2
    echo "pip install -e '$1' failed" >&2
    exit 1
  fi
  rm -f "$log"
  ensure_llama_without_amx
}
# pip reuses a cached llama-cpp-python wheel whatever CMAKE_ARGS say: one built before the AMX kernels
# were left out (scripts/llama_cpp_minimal.cmake) is dropped from the cache and rebuilt, once.
ensure_llama_without_amx() {
  .venv/bin/python -c 'import sys, llama_cpp; sys.exit("AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode())' \
    2>/dev/null && return 0
  echo "scripts/_venv.sh: rebuilding llama-cpp-python without AMX kernels (~3 min)" >&2
  local version
  version=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
  .venv/bin/python -m pip cache remove -q llama_cpp_python || true
  .venv/bin/python -m pip install --disable-pip-version-check -q --force-reinstall --no-deps "llama-cpp-python==$version"
}
