#!/usr/bin/env bash
# Installs the Debian packages Kanal's tests and tools use, only those that are missing.
# Run as root (or with sudo available) on Debian/Ubuntu: bash scripts/setup.sh
set -euo pipefail

missing=()
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }  # command, package

need_cmd ip iproute2
need_cmd curl curl
need_cmd socat socat     # test/e2e/connect-half-close.test.ts: a real client that half-closes (socat -t)
need_cmd openssl openssl
need_cmd systemd-analyze systemd
need_cmd kubectl kubernetes-client
need_cmd python3 python3    # test/packaging/: an independent NOTIFY_SOCKET listener
need_cmd promtool prometheus  # test/deploy/: promtool checks and unit-tests the alert rules, parses the dashboard's queries
need_cmd setpriv util-linux # test/packaging/: run the agent as non-root with only CAP_NET_ADMIN
need_cmd strip binutils    # npm run package: the executable carries a stripped copy of node
# test/interop/grpc-go: grpc-go, the gRPC library of upstream's agent, server and the KAS's client
need_cmd go golang-go
need_path() { [[ -e "$1" ]] || missing+=("$2"); }  # path, package
need_path /usr/share/gocode/src/google.golang.org/grpc golang-google-grpc-dev
need_path /usr/share/gocode/src/google.golang.org/protobuf golang-google-protobuf-dev

if ((${#missing[@]} > 0)); then
  sudo=()
  ((EUID == 0)) || sudo=(sudo)
  echo "setup: installing ${missing[*]}" >&2
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's prometheus package is the whole server (for its promtool); where systemd runs, it enables and starts it on :9090.
# The tests need only promtool: leave no server behind.
if [[ " ${missing[*]:-} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
  "${sudo[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
