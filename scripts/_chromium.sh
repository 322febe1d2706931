# Sourced by scripts/test.sh (also runnable on its own): make sure headless Chromium is present for the
# `browser` tests (report rendering). Installs Debian's `chromium` quietly with apt-get when missing.
ensure_chromium() {
  [ -x /usr/bin/chromium ] && return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "scripts/_chromium.sh: /usr/bin/chromium is missing and apt-get is not available" >&2
    return 1
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  local log
  log=$(mktemp)
  if ! { DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq \
         && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
              chromium fonts-dejavu-core; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "scripts/_chromium.sh: installing chromium failed" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}
# Run directly (`bash scripts/_chromium.sh`): install now.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  ensure_chromium
fi
