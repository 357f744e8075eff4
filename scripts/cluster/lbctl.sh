#!/usr/bin/env bash
# lbctl as the running cluster's DaemonSet, deployed as docs/deploy.md
# says: `make image`'s archive imported into every node's containerd (no
# registry: what `ctr images import` on each node does for a user without
# one), then `kubectl apply -k` of this cluster's overlay,
# manifests/lbctl/ (deploy/base with only this cluster's knobs). Waits
# until the DaemonSet has rolled out on every node it selects.
#
# Usage: lbctl.sh [--image ARCHIVE] [--name REPO]  import, apply, wait
#        lbctl.sh --import-only [--image ARCHIVE] [--name REPO]
#        lbctl.sh --delete                       kubectl delete -k
# ARCHIVE defaults to build/image/lbctl-VERSION.oci.tar (make image), REPO
# to lbctl.local/lbctl: the image is REPO:TAG, TAG the archive's own.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
k() { "$here/kubectl.sh" "$@"; }
overlay=$here/manifests/lbctl
version=$(node -p 'require(process.argv[1]).version' "$CLUSTER_ROOT/package.json")
archive=$CLUSTER_ROOT/build/image/lbctl-$version.oci.tar
name=lbctl.local/lbctl
mode=apply
while (($#)); do
  case $1 in
    --image) archive=$(realpath "$2"); shift 2 ;;
    --name) name=$2; shift 2 ;;
    --import-only) mode=import; shift ;;
    --delete) mode=delete; shift ;;
    *) die "lbctl.sh: unknown argument $1" ;;
  esac
done
if [[ $mode == delete ]]; then
  k delete --ignore-not-found -k "$overlay" >&2
  exit 0
fi
[[ -s $archive ]] || die "no image archive $archive: make image"
"$here/import.sh" --base-name "$name" "$archive"
log "imported $archive as $name into ${CLUSTER_NODES[*]}"
[[ $mode == apply ]] || exit 0
k apply -k "$overlay" >&2
k -n kube-system rollout status daemonset/lbctl --timeout=180s >&2
