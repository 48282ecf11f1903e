#!/usr/bin/env bash
# The whole test suite: builds the local control planes if they are not cached yet
# (several minutes the first time, with progress), then runs every test of the workspace
# against real etcd + kube-apiserver processes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/build-control-plane.sh >/dev/null
exec cargo test --workspace "$@"
