#!/usr/bin/env bash
# kube-proxy (iptables mode, the shared binary) as the running cluster's
# DaemonSet: manifests/kube-proxy.yaml, with our image (images.sh, imported
# by every node at start). Waits until it runs on every node it selects.
#
# Usage: kube-proxy.sh [--node-selector KEY=VALUE]   (apply, then wait)
#        kube-proxy.sh --delete
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
k() { "$here/kubectl.sh" "$@"; }
if [[ ${1:-} == --delete ]]; then
  sed 's/@[A-Z_]*@//g' "$here/manifests/kube-proxy.yaml" | k delete --ignore-not-found -f -
  exit 0
fi
selector=
if [[ ${1:-} == --node-selector ]]; then
  selector="nodeSelector: { \"${2%%=*}\": \"${2#*=}\" }"
fi
sed -e "s|@POD_CIDR@|$CLUSTER_POD_CIDR|" -e "s|@APISERVER@|$CLUSTER_APISERVER_IP:$CLUSTER_APISERVER_PORT|" \
  -e "s|@IMAGE@|$CLUSTER_KUBE_PROXY_IMAGE|" -e "s|@NODE_SELECTOR@|$selector|" "$here/manifests/kube-proxy.yaml" |
  k apply -f - >/dev/null
k -n kube-system rollout status daemonset/kube-proxy --timeout=120s >&2
