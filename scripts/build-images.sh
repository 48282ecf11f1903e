#!/usr/bin/env bash
# Builds the container images of real-node tests without a registry (docs/operations.md,
# "Images without a registry") as docker-archive tars that `ctr -n k8s.io images import`
# loads, and prints the one (absolute) directory holding them:
#
#   service-mirror.tar  service-mirror.local/service-mirror:dev: the release binary built
#                       as the Dockerfile builds it, the shared libraries `ldd` names
#                       (copied from the host), /etc/passwd and /etc/group with nonroot
#                       65532, CA certificates and /tmp; Entrypoint, User and ports as the
#                       Dockerfile's final stage.
#   pause.tar           service-mirror.local/pause:3.10: images/pause/pause.c, static.
#   pause               that static binary itself (the harness's pid-1 reaper per node).
#   busybox.tar         service-mirror.local/busybox:1.35: Debian's busybox-static with
#                       its applet links, /etc/passwd and /www/index.html (the tests' HTTP
#                       workload `httpd -f -p 8080 -h /www`, client `wget -qO- <url>` and
#                       TCP forwarder `nc -ll -p 4143 -e nc <target> <port>`; this busybox
#                       has no tcpsvd).
#   mcs-conformance/stand-in.tar
#                       docker.io/nicolaka/netshoot:v0.15 and docker.io/alpine/socat:1.7.4.4,
#                       the images of the upstream MCS conformance suite's Pods: busybox's
#                       root with images/mcs-conformance/socat (a shim). Nodes do not
#                       import it; `demo --mcs-conformance` on real nodes does.
#
#   scripts/build-images.sh            build what is missing or stale, print the dir
#   scripts/build-images.sh --print    only print the dir (no build)
#
# Nothing is pulled: the Dockerfile starts from registry images (rust, distroless) and
# stays for users with a registry; this builds the equivalent `FROM scratch` image from
# the binary compiled here. Its cargo arguments, final-stage ENTRYPOINT, USER, EXPOSE and
# the binary's path are read from the Dockerfile, so the two cannot drift.
#
# Each archive is rebuilt only when a content hash of its inputs changed, and is
# byte-for-byte reproducible (sorted entries, mtime 0, owner 0:0, sorted JSON).
#
# SERVICE_MIRROR_IMAGES_DIR=<dir>: use the archives in <dir>; nothing is built, the dir is
# checked and printed. SERVICE_MIRROR_IMAGE_BINARY=<file>: package this service-mirror
# binary instead of running cargo (it must be a --no-default-features build: its
# `--version` says "(features: none)"). SERVICE_MIRROR_CACHE moves the cache (default
# ~/.cache/service-mirror); the images of a checkout go to <cache>/images/<checkout key>,
# one directory per checkout, as each packages its own binary.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${SERVICE_MIRROR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/service-mirror}
archives=(service-mirror.tar pause.tar busybox.tar)

log() { echo "[images] $*" >&2; }
die() {
  log "error: $*"
  exit 1
}

case "${1:-}" in
  "" | --print) ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *)
    log "error: unknown argument '$1' (see --help)"
    exit 2
    ;;
esac

if [[ -n "${SERVICE_MIRROR_IMAGES_DIR:-}" ]]; then
  given=$SERVICE_MIRROR_IMAGES_DIR
  for f in "${archives[@]}"; do
    [[ -s "$given/$f" ]] || die "SERVICE_MIRROR_IMAGES_DIR=$given lacks $f"
  done
  [[ -x "$given/pause" ]] || die "SERVICE_MIRROR_IMAGES_DIR=$given lacks an executable pause"
  (cd "$given" && pwd)
  exit 0
fi

dir="$cache/images/$(printf '%s' "$root" | sha256sum | cut -c1-16)"
if [[ "${1:-}" == --print ]]; then
  echo "$dir"
  exit 0
fi

for tool in tar sha256sum jq gcc ldd; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' is needed to build the images"
done

# --- The Dockerfile: the build's cargo arguments and the final stage's config ---------
dockerfile="$root/Dockerfile"
# Continuation lines joined, comments dropped.
joined=$(sed -e '/^[[:space:]]*#/d' "$dockerfile" | sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta')
final_stage=$(awk '/^FROM[[:space:]]/ { buf = "" } { buf = buf $0 "\n" } END { printf "%s", buf }' <<<"$joined")
instruction() { # the arguments of the last <instruction> of the final stage
  awk -v i="$1" 'toupper($1) == i { sub(/^[[:space:]]*[A-Za-z]+[[:space:]]+/, ""); v = $0 } END { print v }' <<<"$final_stage"
}
entrypoint=$(instruction ENTRYPOINT)
jq -e 'type == "array" and length > 0 and all(type == "string")' <<<"$entrypoint" >/dev/null 2>&1 ||
  die "the Dockerfile's final ENTRYPOINT is not in JSON (exec) form: '$entrypoint'"
entrypoint=$(jq -c . <<<"$entrypoint")
user=$(instruction USER)
[[ "$user" =~ ^[0-9]+(:[0-9]+)?$ ]] || die "the Dockerfile's final USER is not numeric: '$user'"
ports=$(instruction EXPOSE)
# The binary: `COPY --from=<stage> <src> <dest>` in the final stage.
binary_path=$(awk 'toupper($1) == "COPY" && $2 ~ /^--from=/ && NF == 4 { v = $4 } END { print v }' <<<"$final_stage")
[[ "$binary_path" == /* ]] || die "the Dockerfile's final stage copies no binary (COPY --from=<stage> <src> <dest>)"
# `cargo build ...` up to the end of its shell command.
read -r -a cargo_args <<<"$(grep -o 'cargo build[^&;|]*' <<<"$joined" | head -n 1 | sed 's/^cargo //')"
((${#cargo_args[@]} > 1)) || die "the Dockerfile runs no 'cargo build'"
bin_name=
for ((i = 0; i < ${#cargo_args[@]}; i++)); do
  [[ "${cargo_args[$i]}" =~ ^[A-Za-z0-9_.=,/-]+$ ]] || die "unexpected cargo argument in the Dockerfile: '${cargo_args[$i]}'"
  [[ "${cargo_args[$i]}" == --bin ]] && bin_name=${cargo_args[$((i + 1))]:-}
done
[[ " ${cargo_args[*]} " == *" --release "* && -n "$bin_name" ]] ||
  die "the Dockerfile's cargo build lacks --release or --bin: ${cargo_args[*]}"

mkdir -p "$dir"
work=$(mktemp -d "$dir/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT

case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) arch=$(uname -m) ;;
esac

# The layer of <rootfs>: sorted, mtime 0, owned by 0:0 (nothing in these images needs
# another owner: the controller writes nowhere but /tmp, which is 1777).
layer_tar() { # rootfs out
  (cd "$1" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort) |
    tar -C "$1" --format=gnu --no-recursion --mtime=@0 --owner=0 --group=0 --numeric-owner \
      --no-acls --no-xattrs --no-selinux -cf "$2" -T -
}

# A docker-archive (the `docker save` layout) of one single-layer image.
# tags: its names, separated by spaces; config_json: the image's "config" object.
archive() { # rootfs tags config_json out
  local rootfs=$1 tag=$2 config=$3 out=$4 a="$work/archive" layer_sha config_sha
  rm -rf "$a" && mkdir -p "$a"
  layer_tar "$rootfs" "$a/layer.tar"
  layer_sha=$(sha256sum "$a/layer.tar" | cut -d' ' -f1)
  mkdir "$a/$layer_sha" && mv "$a/layer.tar" "$a/$layer_sha/layer.tar"
  jq -cS -n --arg arch "$arch" --argjson config "$config" --arg diff "sha256:$layer_sha" \
    '{architecture: $arch, os: "linux", created: "1970-01-01T00:00:00Z", config: $config,
      rootfs: {type: "layers", diff_ids: [$diff]}}' >"$a/config.json"
  config_sha=$(sha256sum "$a/config.json" | cut -d' ' -f1)
  mv "$a/config.json" "$a/$config_sha.json"
  jq -c -n --arg config "$config_sha.json" --arg tags "$tag" --arg layer "$layer_sha/layer.tar" \
    '[{Config: $config, RepoTags: ($tags | split(" ")), Layers: [$layer]}]' >"$a/manifest.json"
  layer_tar "$a" "$out.tmp.$$"
  mv "$out.tmp.$$" "$out"
}

# Rebuilds <name> only when the hash of its inputs changed: prints nothing, returns 1
# when current.
stale() { # name inputs-hash
  [[ -s "$dir/$1" && "$(cat "$dir/$1.inputs" 2>/dev/null)" == "$2" ]] && return 1
  return 0
}
self_sha=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)

passwd_root='root:x:0:0:root:/root:/sbin/nologin'
passwd_nobody='nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin'

# --- pause ----------------------------------------------------------------------------
pause_src="$root/images/pause/pause.c"
pause_key=$(cat "$pause_src" <(gcc --version | head -n 1) <(echo "$self_sha") | sha256sum | cut -d' ' -f1)
if stale pause.tar "$pause_key" || [[ ! -x "$dir/pause" ]]; then
  r="$work/pause-root"
  mkdir -p "$r"
  gcc -static -Os -s -o "$r/pause" "$pause_src" || die "gcc -static failed on $pause_src (is libc6-dev installed?)"
  chmod 0755 "$r/pause"
  archive "$r" service-mirror.local/pause:3.10 \
    '{"Entrypoint": ["/pause"], "User": "65535:65535", "WorkingDir": "/"}' "$dir/pause.tar"
  install -m 0755 "$r/pause" "$dir/pause.tmp.$$" && mv "$dir/pause.tmp.$$" "$dir/pause"
  echo "$pause_key" >"$dir/pause.tar.inputs"
  log "built pause.tar and pause"
fi

# --- busybox --------------------------------------------------------------------------
busybox=/bin/busybox
[[ -x "$busybox" ]] || die "$busybox is missing: install Debian's busybox-static (as root, scripts/build-control-plane.sh --node does, or apt-get install -y busybox-static)"
busybox_key=$(cat <(sha256sum "$busybox") <(echo "$self_sha") | sha256sum | cut -d' ' -f1)
# The busybox image's root in <dir>.
busybox_root() { # dir
  local r=$1 applets a
  mkdir -p "$r/bin" "$r/etc" "$r/www" "$r/tmp"
  install -m 0755 "$busybox" "$r/bin/busybox"
  ldd "$busybox" >/dev/null 2>&1 && die "$busybox is not static (the image holds no libraries)"
  applets=$("$busybox" --list)
  # Debian's busybox-static 1.35 has no tcpsvd: the TCP forwarder (gateway) is
  # `nc -ll -p <port> -e nc <target> <port>`, one forked nc per connection. Its `wget -T`
  # crashes (SIGSEGV); plain `wget -qO-` works.
  for a in sh httpd nc sleep cat echo wget nslookup; do
    grep -qx "$a" <<<"$applets" || die "$busybox lacks the applet $a"
  done
  while read -r a; do
    [[ "$a" == busybox || -z "$a" ]] || ln -s busybox "$r/bin/$a"
  done <<<"$applets"
  printf '%s\n' "$passwd_root" "$passwd_nobody" >"$r/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$r/etc/group"
  echo 'service-mirror test workload' >"$r/www/index.html"
  chmod 0644 "$r/etc/passwd" "$r/etc/group" "$r/www/index.html"
  chmod 0755 "$r/bin" "$r/etc" "$r/www"
  chmod 1777 "$r/tmp"
}
if stale busybox.tar "$busybox_key"; then
  r="$work/busybox-root"
  busybox_root "$r"
  archive "$r" service-mirror.local/busybox:1.35 \
    '{"Cmd": ["sh"], "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "WorkingDir": "/"}' \
    "$dir/busybox.tar"
  echo "$busybox_key" >"$dir/busybox.tar.inputs"
  log "built busybox.tar"
fi

# --- the MCS conformance suite's images ------------------------------------------------
# Its request Pod (nicolaka/netshoot) runs `nslookup` and `nc`, its hello Pods
# (alpine/socat) a socat listener: busybox under both names, with a socat shim
# (images/mcs-conformance/socat). No nc shim can drop the suite's `nc -v -4`, which
# busybox nc rejects: Debian's busybox sh runs its own applets before any file on PATH.
# In a subdirectory, so that nodes do not import it: only `demo --mcs-conformance` on
# real nodes does (crates/demo/src/conformance.rs).
standin_src="$root/images/mcs-conformance"
standin_key=$(cat <(sha256sum "$busybox" "$standin_src"/*) <(echo "$self_sha") | sha256sum | cut -d' ' -f1)
if stale mcs-conformance/stand-in.tar "$standin_key"; then
  mkdir -p "$dir/mcs-conformance"
  busybox_root "$work/stand-in-root"
  r="$work/stand-in-root"
  mkdir -p "$r/usr/local/bin"
  install -m 0755 "$standin_src/socat" "$r/usr/local/bin/"
  chmod 0755 "$r/usr" "$r/usr/local" "$r/usr/local/bin"
  archive "$r" "docker.io/nicolaka/netshoot:v0.15 docker.io/alpine/socat:1.7.4.4" \
    '{"Cmd": ["sh"], "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "WorkingDir": "/"}' \
    "$dir/mcs-conformance/stand-in.tar"
  echo "$standin_key" >"$dir/mcs-conformance/stand-in.tar.inputs"
  log "built mcs-conformance/stand-in.tar"
fi

# --- service-mirror -------------------------------------------------------------------
if [[ -n "${SERVICE_MIRROR_IMAGE_BINARY:-}" ]]; then
  binary=$SERVICE_MIRROR_IMAGE_BINARY
  [[ -x "$binary" ]] || die "SERVICE_MIRROR_IMAGE_BINARY=$binary is not an executable"
else
  command -v cargo >/dev/null 2>&1 || die "cargo is needed to build the release binary"
  # Run from a test, cargo's per-process variables are set; some build scripts (ring's)
  # rerun when CARGO_MANIFEST_DIR changes, and the release build would then recompile
  # ring and everything above it (3-6 min) each time it flips between a shell and a test.
  for v in $(compgen -e); do
    case "$v" in
      CARGO_MANIFEST_* | CARGO_PKG_* | CARGO_CRATE_NAME | CARGO_BIN_* | CARGO_PRIMARY_PACKAGE | \
        CARGO_TARGET_TMPDIR | CARGO_RUSTC_CURRENT_DIR | OUT_DIR) unset "$v" ;;
    esac
  done
  log "cargo ${cargo_args[*]} (as the Dockerfile; a no-op when current)"
  (cd "$root" && nice -n 10 cargo "${cargo_args[@]}" >&2) || die "cargo ${cargo_args[*]} failed"
  target_dir=$(cd "$root" && cargo metadata --format-version 1 --no-deps | jq -r .target_directory)
  binary="$target_dir/release/$bin_name"
fi
# The Dockerfile's build has no default features, so neither has the packaged binary.
version=$("$binary" --version) || die "$binary --version failed"
[[ "$version" == *"(features: none)"* ]] ||
  die "$binary is not a --no-default-features build ('$version'); the image packages the release build"

# The shared libraries, at the paths the loader looks for them: `ldd` prints the
# resolved path of each (and the interpreter's own path).
libs=()
while read -r line; do
  case "$line" in
    *"not found"*) die "$binary needs a library the host lacks: $line" ;;
    *"=> /"*) p=${line#*=> } && libs+=("${p%% (*}") ;;
    /*) libs+=("${line%% (*}") ;;
  esac
done < <(ldd "$binary" 2>/dev/null || true)
lib_shas=$(for l in "${libs[@]}"; do printf '%s %s\n' "$l" "$(sha256sum <"$l" | cut -d' ' -f1)"; done)
ca=/etc/ssl/certs/ca-certificates.crt
[[ -s "$ca" ]] || die "$ca is missing (Debian package ca-certificates)"
sm_key=$(cat <(sha256sum <"$binary") <(echo "$lib_shas") <(sha256sum <"$ca") \
  <(echo "$self_sha $entrypoint $user $ports $binary_path ${cargo_args[*]}") | sha256sum | cut -d' ' -f1)
if stale service-mirror.tar "$sm_key"; then
  r="$work/service-mirror-root"
  mkdir -p "$r/etc/ssl/certs" "$r/tmp"
  install -D -m 0755 "$binary" "$r$binary_path"
  for l in "${libs[@]}"; do
    install -D -m 0755 "$(readlink -f "$l")" "$r$l"
  done
  printf '%s\n' "$passwd_root" "$passwd_nobody" 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$r/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' 'nonroot:x:65532:' >"$r/etc/group"
  # Host names resolve through files, then DNS (glibc's built-in nss_files and nss_dns).
  printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$r/etc/nsswitch.conf"
  install -m 0644 "$ca" "$r/etc/ssl/certs/ca-certificates.crt"
  chmod 0644 "$r/etc/passwd" "$r/etc/group" "$r/etc/nsswitch.conf"
  find "$r" -type d -exec chmod 0755 {} +
  chmod 1777 "$r/tmp"
  ports_json=$(for p in $ports; do [[ "$p" == */* ]] && echo "$p" || echo "$p/tcp"; done |
    jq -R . | jq -s 'map({key: ., value: {}}) | from_entries')
  # WorkingDir is / (not distroless's /home/nonroot): runc would have to create a missing
  # working directory, which a read-only root filesystem refuses.
  config=$(jq -n --argjson ep "$entrypoint" --arg user "$user" --argjson ports "$ports_json" \
    --arg build "cargo ${cargo_args[*]}" --arg version "$version" \
    '{Entrypoint: $ep, User: $user, ExposedPorts: $ports, WorkingDir: "/",
      Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],
      Labels: {"dev.service-mirror.build": $build, "dev.service-mirror.version": $version}}')
  archive "$r" service-mirror.local/service-mirror:dev "$config" "$dir/service-mirror.tar"
  echo "$sm_key" >"$dir/service-mirror.tar.inputs"
  log "built service-mirror.tar ($version; ${#libs[@]} libraries)"
fi

echo "$dir"
