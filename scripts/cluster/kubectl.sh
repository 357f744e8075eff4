#!/usr/bin/env bash
# kubectl against the cluster: the API server listens in the control
# plane's network namespace only, so kubectl runs there, with the admin
# kubeconfig. `kubectl.sh --path` prints the kubectl binary it uses
# (scripts/tools/kubectl.sh: the machine's own when new enough, otherwise
# Debian trixie's).
#
# Usage: kubectl.sh ARGS...
set -euo pipefail
source "$(dirname "$0")/lib.sh"
kubectl=${KUBECTL:-$(bash "$CLUSTER_ROOT/scripts/tools/kubectl.sh")}
[[ ${1:-} != --path ]] || { echo "$kubectl"; exit 0; }
exec nsenter --net="/run/netns/$CLUSTER_CP_NETNS" -- "$kubectl" --kubeconfig "$CLUSTER_STATE/admin.kubeconfig" "$@"
