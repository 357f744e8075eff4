#!/usr/bin/env bash
# Imports OCI archives into every node's containerd (the k8s.io namespace,
# kubelet's), through the node's own mount namespace (that of its
# containerd): what `ctr images import` on each node does for a user
# without a registry. An archive whose index names its image
# (io.containerd.image.name, as images.sh makes them) is tagged so; else
# --base-name REPO names it REPO:TAG, TAG the archive's own.
#
# Usage: import.sh [--base-name REPO] ARCHIVE...
set -euo pipefail
source "$(dirname "$0")/lib.sh"
base=()
if [[ ${1:-} == --base-name ]]; then base=(--base-name "$2"); shift 2; fi
(($#)) || die "import.sh: no archive"
for n in "${CLUSTER_NODES[@]}"; do
  pid=$(recorded_pid "$n-containerd") || die "$n's containerd is not running"
  for a in "$@"; do
    a=$(realpath "$a")
    nsenter -t "$pid" -m -n -- ctr --address /run/containerd/containerd.sock -n k8s.io \
      images import "${base[@]}" "$a" >/dev/null
  done
done
