#!/usr/bin/env bash
# Builds etcd and kube-apiserver from Go modules (through the module proxy) using the
# wrapper modules in control-plane/, and caches the binaries per version outside the
# work tree. Idempotent: a cached binary is reused. Prints the directory holding both.
#
#   scripts/build-control-plane.sh          build what is missing, print the bin dir
#   scripts/build-control-plane.sh --print  only print the bin dir (no build)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${SERVICE_MIRROR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/service-mirror}

# The version of each program is the one its wrapper go.mod requires.
version_of() { # wrapper-dir module-path
  awk -v m="$2" '$1 == "require" && $2 == m { print $3; exit } $1 == m && $2 ~ /^v/ { print $2; exit }' \
    "$root/control-plane/$1/go.mod"
}
etcd_version=$(version_of etcd go.etcd.io/etcd/server/v3)
kube_version=$(version_of kube-apiserver k8s.io/kubernetes)
bin="$cache/bin/etcd-$etcd_version-kube-$kube_version"

if [[ "${1:-}" == "--print" ]]; then
  echo "$bin"
  exit 0
fi

log() { echo "[control-plane] $*" >&2; }

# Temporary build directories, removed however the script ends.
scratch=()
cleanup() { for d in "${scratch[@]}"; do rm -rf "$d"; done; }
trap cleanup EXIT

build() { # name wrapper-dir package
  local name=$1 wrapper=$2 pkg=$3
  if [[ -x "$bin/$name" ]]; then
    log "$name: cached at $bin/$name"
    return
  fi
  if ! command -v go >/dev/null 2>&1; then
    log "error: 'go' is not on PATH; install Go >= 1.24 to build $name from Go modules"
    exit 1
  fi
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/sm-build-$name.XXXXXX")
  scratch+=("$work")
  cp "$root/control-plane/$wrapper/go.mod" "$root/control-plane/$wrapper/go.sum" "$work/"
  export CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off GOTOOLCHAIN=local
  local start=$SECONDS
  log "$name: downloading modules for $wrapper ($(go version | awk '{print $3}'))"
  if ! (cd "$work" && go mod download 2>"$work/download.log"); then
    log "error: could not fetch the Go modules for $name:"
    tail -n 20 "$work/download.log" >&2
    exit 1
  fi
  log "$name: compiling $pkg (the first build takes several minutes on 2 cores)"
  (cd "$work" && go build -trimpath -buildvcs=false -o "$work/$name" "$pkg") >"$work/build.log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 30
    kill -0 "$pid" 2>/dev/null && log "$name: still compiling ($((SECONDS - start)) s)"
  done
  if ! wait "$pid"; then
    log "error: building $name failed:"
    tail -n 30 "$work/build.log" >&2
    exit 1
  fi
  mkdir -p "$bin"
  mv "$work/$name" "$bin/$name.tmp.$$" && mv "$bin/$name.tmp.$$" "$bin/$name"
  log "$name: built in $((SECONDS - start)) s -> $bin/$name"
}

build etcd etcd go.etcd.io/etcd/server/v3
build kube-apiserver kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
echo "$bin"
