# Sourced by the scripts that need Debian packages (scripts/_chromium.sh, scripts/_sandbox.sh):
# `apt_install WHO PKG...` installs them quietly with apt-get (sudo when not root), printing apt's log
# only when it fails.
apt_install() {
  local who=$1
  shift
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "$who: apt-get is not available: install $* by hand" >&2
    return 1
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  local log
  log=$(mktemp)
  if ! { DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq \
         && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"; } \
         >"$log" 2>&1; then
    cat "$log" >&2
    echo "$who: installing $* failed" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}
