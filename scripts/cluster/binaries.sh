#!/usr/bin/env bash
# Unpacks the Kubernetes binaries the cluster runs into the cache and prints
# the directory. CLUSTER_K8S_DIR holds each binary as NAME.xz or NAME, and
# SHA256SUMS, the sums of the uncompressed files; every file is checked
# against it as it is unpacked. The cache directory is named by the sums, so
# new binaries (new sums) are unpacked anew and unchanged ones never again.
#
# Usage: binaries.sh [NAME...]   (default: the cluster's six binaries)
set -euo pipefail
source "$(dirname "$0")/lib.sh"

names=("$@")
((${#names[@]})) || names=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy agnhost)
sums=$CLUSTER_K8S_DIR/SHA256SUMS
[[ -r $sums ]] || die "no $sums: set CLUSTER_K8S_DIR to a directory of Kubernetes binaries and their SHA256SUMS"
cache_lock
dir=$CLUSTER_CACHE/bin/$(sha256sum "$sums" | cut -c1-16)
mkdir -p "$dir"

for name in "${names[@]}"; do
  [[ -x $dir/$name ]] && continue
  want=$(awk -v n="$name" '$2 == n || $2 == "*" n { print $1 }' "$sums")
  [[ -n $want ]] || die "$sums has no sum for $name"
  tmp=$dir/.$name.tmp
  if [[ -r $CLUSTER_K8S_DIR/$name.xz ]]; then
    log "unpacking $name"
    xz -dc "$CLUSTER_K8S_DIR/$name.xz" >"$tmp"
  elif [[ -r $CLUSTER_K8S_DIR/$name ]]; then
    cp "$CLUSTER_K8S_DIR/$name" "$tmp"
  else
    die "neither $CLUSTER_K8S_DIR/$name.xz nor $CLUSTER_K8S_DIR/$name"
  fi
  got=$(sha256sum "$tmp" | cut -d' ' -f1)
  [[ $got == "$want" ]] || { rm -f "$tmp"; die "$name: sha256 $got, SHA256SUMS says $want"; }
  chmod 755 "$tmp"
  mv "$tmp" "$dir/$name"
done
# Directories of other sums are binaries nothing uses any more.
cache_prune "$dir" "$CLUSTER_CACHE/bin" -mindepth 1 -maxdepth 1 -type d
echo "$dir"
