#!/usr/bin/env bash
# Builds etcd and kube-apiserver from Go modules (through the module proxy) using the
# wrapper modules in control-plane/, and caches the binaries per version outside the
# work tree. Idempotent: a cached binary is reused. Prints the directory holding both.
#
#   scripts/build-control-plane.sh             build what is missing, print the bin dir
#   scripts/build-control-plane.sh --print     only print the bin dir (no build)
#   scripts/build-control-plane.sh --check     exit 1 with the reason if a build is needed
#                                              and cannot run (no Go, or too old a Go)
#   scripts/build-control-plane.sh --regen [vX.Y.Z]
#                                              rewrite control-plane/kube-apiserver/go.mod
#                                              and go.sum for k8s.io/kubernetes vX.Y.Z
#                                              (default: the current version); needs the
#                                              module proxy
#   scripts/build-control-plane.sh --data-plane [--print]
#                                              the data plane instead (docs/data-plane.md):
#                                              kube-controller-manager and kube-proxy (same
#                                              wrapper module and k8s.io/kubernetes version
#                                              as kube-apiserver) and CoreDNS (wrapper
#                                              control-plane/coredns), cached in a sibling
#                                              dir keyed by both versions, which is
#                                              printed. As root it also installs the host
#                                              tools they need (nft, ip: Debian packages
#                                              nftables, iproute2) when missing.
#   scripts/build-control-plane.sh --node-packages
#                                              only the node's Debian packages (as root),
#                                              no Go: what .ci/run installs before it
#                                              builds images beside the Go builds
#   scripts/build-control-plane.sh --node [--print]
#                                              real nodes (docs/real-node.md): kubelet and
#                                              kube-scheduler (same wrapper module and
#                                              version as kube-apiserver) and helm (wrapper
#                                              control-plane/helm), cached in a sibling dir
#                                              keyed by both versions, which is printed. As
#                                              root it also installs the node's host
#                                              packages (containerd, runc,
#                                              containernetworking-plugins, busybox-static)
#                                              when missing.
#
# --check covers every set. Go builds run under `nice -n 10` (shared 2-core machines).
#
# Go: building needs Go >= the highest `go` directive of control-plane/*/go.mod (checked
# up front; no toolchain is downloaded: GOTOOLCHAIN=local).
#
# SERVICE_MIRROR_CONTROL_PLANE_DIR=<dir>: use the etcd and kube-apiserver in <dir>; nothing
# is built and Go is not needed. The (absolute) dir is printed; it is an error if it lacks
# either binary. SERVICE_MIRROR_DATA_PLANE_DIR=<dir> does the same for the data plane
# (kube-controller-manager, kube-proxy, coredns). SERVICE_MIRROR_CACHE moves the cache
# (default ~/.cache/service-mirror).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${SERVICE_MIRROR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/service-mirror}

log() { echo "[control-plane] $*" >&2; }

# The version of each program is the one its wrapper go.mod requires.
version_of() { # wrapper-dir module-path
  awk -v m="$2" '$1 == "require" && $2 == m { print $3; exit } $1 == m && $2 ~ /^v/ { print $2; exit }' \
    "$root/control-plane/$1/go.mod"
}
etcd_version=$(version_of etcd go.etcd.io/etcd/server/v3)
kube_version=$(version_of kube-apiserver k8s.io/kubernetes)
coredns_version=$(version_of coredns github.com/coredns/coredns)
helm_version=$(version_of helm helm.sh/helm/v4)
bin="$cache/bin/etcd-$etcd_version-kube-$kube_version"
dp_bin="$cache/bin/data-plane-kube-$kube_version-coredns-$coredns_version"
node_bin="$cache/bin/node-kube-$kube_version-helm-$helm_version"
# CoreDNS's plugin set is its wrapper's main.go, its modules go.mod and go.sum: a cached
# coredns built from another main.go, go.mod or go.sum (one without `forward`, or with
# another plugin's version, say) is built again (the stamp beside it).
coredns_stamp=$(cat "$root/control-plane/coredns/main.go" "$root/control-plane/coredns/go.mod" "$root/control-plane/coredns/go.sum" | sha256sum | cut -c1-16)
coredns_current() { [[ -x "$dp_bin/coredns" && "$(cat "$dp_bin/coredns.stamp" 2>/dev/null)" == "$coredns_stamp" ]]; }

mode=${1:-build}
if [[ "$mode" == --data-plane ]]; then
  case "${2:-}" in
    "") mode=--data-plane ;;
    --print) mode=--print-data-plane ;;
    *)
      log "error: unknown argument '$2' after --data-plane (see --help)"
      exit 2
      ;;
  esac
fi
if [[ "$mode" == --node ]]; then
  case "${2:-}" in
    "") mode=--node ;;
    --print) mode=--print-node ;;
    *)
      log "error: unknown argument '$2' after --node (see --help)"
      exit 2
      ;;
  esac
fi
case "$mode" in
  build | --print | --check | --regen | --data-plane | --print-data-plane | --node | --print-node | --node-packages) ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *)
    log "error: unknown argument '$mode' (see --help)"
    exit 2
    ;;
esac

# Host tools of the data plane: kube-proxy's nftables mode runs `nft`, the harness runs
# `ip`. Installed as root when missing (Debian); otherwise named, and the data-plane tests
# skip (no root) or fail saying so.
host_tools() {
  local missing_pkgs=() tool pkg
  for tool in nft:nftables ip:iproute2; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing_pkgs+=("${tool#*:}")
  done
  ((${#missing_pkgs[@]} == 0)) && return 0
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing ${missing_pkgs[*]} (apt-get; needed by the data plane)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing_pkgs[@]}"; } >&2; then
      log "error: apt-get install ${missing_pkgs[*]} failed; install the Debian packages ${missing_pkgs[*]}"
      return 1
    fi
    return 0
  fi
  log "warning: the data plane needs the packages ${missing_pkgs[*]} (commands nft, ip), missing; install them as root (apt-get install -y ${missing_pkgs[*]})"
  [[ $(id -u) != 0 ]] # without root the data-plane tests skip anyway
}

# Host packages of a real node (docs/real-node.md): containerd 1.6 and runc serve CRI v1
# to kubelet; the CNI bridge and host-local plugins give pods their addresses;
# busybox-static is the test images' userland (httpd, a TCP forwarder). Installed as root
# when missing; without root the node tests skip anyway.
node_packages() {
  local missing_pkgs=() probe
  for probe in /usr/bin/containerd:containerd /usr/sbin/runc:runc \
    /usr/lib/cni/bridge:containernetworking-plugins /bin/busybox:busybox-static; do
    [[ -x "${probe%%:*}" ]] || missing_pkgs+=("${probe#*:}")
  done
  ((${#missing_pkgs[@]} == 0)) && return 0
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing ${missing_pkgs[*]} (apt-get; needed by real nodes)"
    # No service is started: the harness runs one containerd per node itself.
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing_pkgs[@]}"; } >&2; then
      log "error: apt-get install ${missing_pkgs[*]} failed; install the Debian packages ${missing_pkgs[*]}"
      return 1
    fi
    return 0
  fi
  log "warning: real nodes need the packages ${missing_pkgs[*]}, missing; install them as root (apt-get install -y ${missing_pkgs[*]})"
  [[ $(id -u) != 0 ]]
}

if [[ "$mode" == --node-packages ]]; then
  node_packages
  exit
fi
if [[ "$mode" == --node || "$mode" == --print-node ]] && [[ -n "${SERVICE_MIRROR_NODE_DIR:-}" ]]; then
  given=$SERVICE_MIRROR_NODE_DIR
  for b in kubelet kube-scheduler helm; do
    if [[ ! -x "$given/$b" ]]; then
      log "error: SERVICE_MIRROR_NODE_DIR=$given lacks an executable $b"
      exit 1
    fi
  done
  [[ "$mode" == --print-node ]] || node_packages || exit 1
  (cd "$given" && pwd)
  exit 0
fi
if [[ "$mode" == --print-node ]]; then
  echo "$node_bin"
  exit 0
fi

# The data plane: a given directory, the cache, or a build.
if [[ "$mode" == --data-plane || "$mode" == --print-data-plane ]]; then
  if [[ -n "${SERVICE_MIRROR_DATA_PLANE_DIR:-}" ]]; then
    given=$SERVICE_MIRROR_DATA_PLANE_DIR
    for b in kube-controller-manager kube-proxy coredns; do
      if [[ ! -x "$given/$b" ]]; then
        log "error: SERVICE_MIRROR_DATA_PLANE_DIR=$given lacks an executable $b"
        exit 1
      fi
    done
    [[ "$mode" == --print-data-plane ]] || host_tools || exit 1
    (cd "$given" && pwd)
    exit 0
  fi
  if [[ "$mode" == --print-data-plane ]]; then
    echo "$dp_bin"
    exit 0
  fi
fi

# A directory given by the user wins over the cache, and needs no Go.
if [[ "$mode" != --regen && "$mode" != --data-plane && "$mode" != --node && -n "${SERVICE_MIRROR_CONTROL_PLANE_DIR:-}" ]]; then
  given=$SERVICE_MIRROR_CONTROL_PLANE_DIR
  if [[ ! -x "$given/etcd" || ! -x "$given/kube-apiserver" ]]; then
    log "error: SERVICE_MIRROR_CONTROL_PLANE_DIR=$given lacks an executable etcd or kube-apiserver"
    exit 1
  fi
  if [[ "$mode" != --check ]]; then
    (cd "$given" && pwd)
    exit 0
  fi
fi

if [[ "$mode" == --print ]]; then
  echo "$bin"
  exit 0
fi

# Go >= the highest `go` directive of the wrapper modules: etcd v3.6.16, for one, declares
# `go 1.26.0`, and with GOTOOLCHAIN=local an older Go refuses the module.
go_needed() { # prints "<version> <go.mod path>"
  local mod v
  for mod in "$root"/control-plane/*/go.mod; do
    v=$(awk '$1 == "go" { print $2; exit }' "$mod")
    [[ -n "$v" ]] && echo "$v ${mod#"$root"/}"
  done | sort -V -k1,1 | tail -n 1
}

check_go() {
  local need need_file have have_num
  read -r need need_file < <(go_needed) || true
  if [[ -z "${need:-}" ]]; then
    log "error: no go directive in $root/control-plane/*/go.mod"
    return 1
  fi
  if ! command -v go >/dev/null 2>&1; then
    log "error: Go >= $need needed to build the control plane (etcd, kube-apiserver; --data-plane: kube-controller-manager, kube-proxy, coredns), found none ('go' is not on PATH)."
    log "       Install Go >= $need (https://go.dev/dl/), or set SERVICE_MIRROR_CONTROL_PLANE_DIR (and SERVICE_MIRROR_DATA_PLANE_DIR) to directories holding the binaries."
    return 1
  fi
  have=$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null || true)
  have_num=$(sed -E -n 's/^go([0-9]+(\.[0-9]+)*).*/\1/p' <<<"$have")
  if [[ -z "$have_num" ]]; then
    log "warning: cannot tell the version of $(command -v go) ('$have'); Go >= $need is needed, trying anyway"
    return 0
  fi
  if [[ "$(printf '%s\n%s\n' "$need" "$have_num" | sort -V | head -n 1)" != "$need" ]]; then
    log "error: Go >= $need needed (the go directive of $need_file), found $have_num at $(command -v go)."
    log "       Install Go >= $need (https://go.dev/dl/), or set SERVICE_MIRROR_CONTROL_PLANE_DIR (and SERVICE_MIRROR_DATA_PLANE_DIR) to directories holding the binaries."
    return 1
  fi
}

# Temporary build directories, removed however the script ends.
scratch=()
cleanup() { for d in "${scratch[@]}"; do rm -rf "$d"; done; }
trap cleanup EXIT

if [[ "$mode" == --regen ]]; then
  # Regenerates the kube-apiserver wrapper module for k8s.io/kubernetes <version>: its
  # go and godebug lines, and its replace block, which maps the staging modules the
  # kubernetes module replaces with local paths (./staging/src/k8s.io/<name>) to their
  # published versions (k8s.io/<name> v0.<minor>.<patch>); then `go mod tidy` fills in
  # require and go.sum.
  version=${2:-$kube_version}
  if [[ ! "$version" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]]; then
    log "error: --regen wants a kubernetes release like v1.34.4, not '$version'"
    exit 2
  fi
  staging="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
  check_go || exit 1
  work=$(mktemp -d "${TMPDIR:-/tmp}/sm-regen.XXXXXX")
  scratch+=("$work")
  export GOFLAGS=-mod=mod GOWORK=off GOTOOLCHAIN=local
  log "reading the go.mod of k8s.io/kubernetes@$version"
  # Outside any module, so that nothing else is resolved.
  if ! json=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$version" 2>"$work/download.log"); then
    log "error: could not download k8s.io/kubernetes@$version:"
    cat "$work/download.log" >&2
    sed -n 's/.*"Error": *"\(.*\)".*/\1/p' <<<"$json" >&2
    exit 1
  fi
  kube_mod=$(sed -n 's/.*"GoMod": *"\(.*\)".*/\1/p' <<<"$json")
  if [[ ! -f "$kube_mod" ]]; then
    log "error: go mod download printed no GoMod file: $json"
    exit 1
  fi
  wrapper="$root/control-plane/kube-apiserver"
  {
    # Keep the wrapper's leading comment block.
    awk '/^\/\// { print; next } { exit }' "$wrapper/go.mod"
    echo "module service-mirror.local/kube-apiserver"
    echo
    awk '$1 == "go" { print; exit }' "$kube_mod"
    echo
    awk '$1 == "godebug" { print }' "$kube_mod"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    echo "tool ("
    echo "	k8s.io/kubernetes/cmd/kube-apiserver"
    echo "	k8s.io/kubernetes/cmd/kube-controller-manager"
    echo "	k8s.io/kubernetes/cmd/kube-proxy"
    echo "	k8s.io/kubernetes/cmd/kube-scheduler"
    echo "	k8s.io/kubernetes/cmd/kubelet"
    echo ")"
    echo
    echo "replace ("
    awk -v v="$staging" '
      $1 == "replace" && $2 == "(" { inside = 1; next }
      inside && $1 == ")" { inside = 0; next }
      inside && $2 == "=>" && $3 ~ /^\.\/staging\/src\// { printf "\t%s => %s %s\n", $1, $1, v }
    ' "$kube_mod"
    echo ")"
  } >"$work/go.mod"
  if ! grep -q "=> k8s.io/" "$work/go.mod"; then
    log "error: no staging replace directives found in $kube_mod"
    exit 1
  fi
  log "go mod tidy (k8s.io/kubernetes $version, staging modules $staging)"
  if ! (cd "$work" && go mod tidy 2>"$work/tidy.log"); then
    log "error: go mod tidy failed:"
    tail -n 30 "$work/tidy.log" >&2
    exit 1
  fi
  cp "$work/go.mod" "$wrapper/go.mod"
  cp "$work/go.sum" "$wrapper/go.sum"
  log "wrote $wrapper/go.mod and go.sum; the next build compiles kube-apiserver $version"
  exit 0
fi

missing=()
if [[ "$mode" == --node ]]; then
  out=$node_bin
  for b in kubelet kube-scheduler helm; do
    [[ -x "$node_bin/$b" ]] || missing+=("$b")
  done
elif [[ "$mode" == --data-plane ]]; then
  out=$dp_bin
  for b in kube-controller-manager kube-proxy; do
    [[ -x "$dp_bin/$b" ]] || missing+=("$b")
  done
  coredns_current || missing+=(coredns)
else
  out=$bin
  if [[ -z "${SERVICE_MIRROR_CONTROL_PLANE_DIR:-}" ]]; then
    [[ -x "$bin/etcd" ]] || missing+=(etcd)
    [[ -x "$bin/kube-apiserver" ]] || missing+=(kube-apiserver)
  fi
fi

if [[ "$mode" == --check ]]; then
  if [[ -z "${SERVICE_MIRROR_DATA_PLANE_DIR:-}" ]]; then
    for b in kube-controller-manager kube-proxy; do
      [[ -x "$dp_bin/$b" ]] || missing+=("$b")
    done
    coredns_current || missing+=(coredns)
  fi
  if [[ -z "${SERVICE_MIRROR_NODE_DIR:-}" ]]; then
    for b in kubelet kube-scheduler helm; do
      [[ -x "$node_bin/$b" ]] || missing+=("$b")
    done
  fi
  ((${#missing[@]} == 0)) || check_go
  exit
fi

# Up front, before anything is downloaded, and only if something is to be built.
if ((${#missing[@]} > 0)); then
  check_go || exit 1
fi

build() { # name wrapper-dir package
  local name=$1 wrapper=$2 pkg=$3
  if [[ -x "$out/$name" ]] && { [[ "$name" != coredns ]] || coredns_current; }; then
    log "$name: cached at $out/$name"
    return
  fi
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/sm-build-$name.XXXXXX")
  scratch+=("$work")
  # go.mod, go.sum and any main package of the wrapper (CoreDNS's).
  cp "$root/control-plane/$wrapper/"go.* "$work/"
  cp "$root/control-plane/$wrapper/"*.go "$work/" 2>/dev/null || true
  # The committed go.sum covers every program built: no -mod=mod, nothing re-resolved.
  export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOWORK=off GOTOOLCHAIN=local
  local start=$SECONDS
  log "$name: downloading modules for $wrapper ($(go version | awk '{print $3}'))"
  if ! (cd "$work" && go mod download 2>"$work/download.log"); then
    log "error: could not fetch the Go modules for $name:"
    tail -n 20 "$work/download.log" >&2
    exit 1
  fi
  log "$name: compiling $pkg (the first build takes several minutes on 2 cores)"
  (cd "$work" && exec nice -n 10 go build -trimpath -buildvcs=false -o "$work/$name" "$pkg") >"$work/build.log" 2>&1 &
  local pid=$!
  local waited=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    ((++waited % 30 == 0)) && kill -0 "$pid" 2>/dev/null && log "$name: still compiling ($((SECONDS - start)) s)"
  done
  if ! wait "$pid"; then
    log "error: building $name failed:"
    tail -n 30 "$work/build.log" >&2
    exit 1
  fi
  mkdir -p "$out"
  mv "$work/$name" "$out/$name.tmp.$$" && mv "$out/$name.tmp.$$" "$out/$name"
  if [[ "$name" == coredns ]]; then
    echo "$coredns_stamp" >"$out/coredns.stamp"
  fi
  log "$name: built in $((SECONDS - start)) s -> $out/$name"
}

if [[ "$mode" == --node ]]; then
  build kubelet kube-apiserver k8s.io/kubernetes/cmd/kubelet
  build kube-scheduler kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler
  build helm helm helm.sh/helm/v4/cmd/helm
  node_packages || exit 1
  echo "$node_bin"
  exit 0
fi
if [[ "$mode" == --data-plane ]]; then
  build kube-controller-manager kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
  build kube-proxy kube-apiserver k8s.io/kubernetes/cmd/kube-proxy
  build coredns coredns service-mirror.local/coredns
  host_tools || exit 1
  echo "$dp_bin"
  exit 0
fi
build etcd etcd go.etcd.io/etcd/server/v3
build kube-apiserver kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
echo "$bin"
