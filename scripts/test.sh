#!/usr/bin/env bash
# The whole test suite: builds the local control planes if they are not cached yet
# (needs Go; several minutes the first time, with progress), then runs every test of the
# workspace against real etcd + kube-apiserver processes. Arguments go to `cargo test`
# (`scripts/test.sh -p local-cluster` runs one package).
#
# SERVICE_MIRROR_CONTROL_PLANE_DIR=<dir holding etcd and kube-apiserver> skips the build
# and the need for Go. The data-plane binaries (kube-controller-manager, kube-proxy,
# CoreDNS: `build-control-plane.sh --data-plane`, which as root also installs nftables and
# iproute2 when missing) are built too; SERVICE_MIRROR_DATA_PLANE_DIR=<dir> skips that.
# So are the node binaries (kubelet, kube-scheduler and helm: `--node`; helm renders and
# installs the chart in tests/cli/links.rs); SERVICE_MIRROR_NODE_DIR=<dir> skips that.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The tests then use this directory as is (an absolute path) instead of each test binary
# asking the script again.
SERVICE_MIRROR_CONTROL_PLANE_DIR=$(bash scripts/build-control-plane.sh)
export SERVICE_MIRROR_CONTROL_PLANE_DIR
SERVICE_MIRROR_DATA_PLANE_DIR=$(bash scripts/build-control-plane.sh --data-plane)
export SERVICE_MIRROR_DATA_PLANE_DIR
SERVICE_MIRROR_NODE_DIR=$(bash scripts/build-control-plane.sh --node)
export SERVICE_MIRROR_NODE_DIR
# The registry-less images (docs/operations.md, "Images without a registry"): the release
# binary (a cold release build takes ~6.5 min on 2 cores) and the test images. Without
# them (no busybox-static, say) the image tests skip, or fail under CI=true.
# SERVICE_MIRROR_IMAGES_DIR=<dir> given: used as is, nothing built.
if images_dir=$(bash scripts/build-images.sh); then
  export SERVICE_MIRROR_IMAGES_DIR=$images_dir
fi
# `-p <package>` narrows the run (with --workspace cargo would run every package).
for arg in "$@"; do
  case "$arg" in
    -p | --package | --package=* | -p?*) exec cargo test "$@" ;;
    --) break ;;
  esac
done
# Other arguments go to `cargo test --workspace` (one binary after another); none runs
# every test binary, several at once (scripts/test-parallel.sh).
[ "$#" -gt 0 ] && exec cargo test --workspace "$@"
exec bash scripts/test-parallel.sh
