# Sourced by scripts/test.sh (also runnable on its own): make sure headless Chromium is present for the
# `browser` tests (report rendering). Installs Debian's `chromium` quietly with apt-get when missing.
source "$(dirname "${BASH_SOURCE[0]}")/_apt.sh"
ensure_chromium() {
  [ -x /usr/bin/chromium ] && return 0
  apt_install scripts/_chromium.sh chromium fonts-dejavu-core
}
# Run directly (`bash scripts/_chromium.sh`): install now.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  ensure_chromium
fi
