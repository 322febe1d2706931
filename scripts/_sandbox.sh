# Sourced by scripts/_venv.sh (also runnable on its own): make sure the `python` tool's sandbox can run
# here: bubblewrap (`bwrap`, the namespaces) and libseccomp (the socket filter, loaded by pyseccomp).
# Installs Debian's packages quietly with apt-get when missing (docs/SANDBOX.md).
source "$(dirname "${BASH_SOURCE[0]}")/_apt.sh"
_have_libseccomp() {
  compgen -G "/usr/lib/*/libseccomp.so.2" >/dev/null || compgen -G "/lib/*/libseccomp.so.2" >/dev/null
}
ensure_bwrap() {
  command -v bwrap >/dev/null 2>&1 && _have_libseccomp && return 0
  apt_install scripts/_sandbox.sh bubblewrap libseccomp2
}
# Run directly (`bash scripts/_sandbox.sh`): install now.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  ensure_bwrap
fi
