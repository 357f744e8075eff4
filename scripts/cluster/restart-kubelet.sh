#!/usr/bin/env bash
# Restarts NODE's kubelet as `systemctl restart kubelet` would: SIGTERM, and
# node.sh starts it again (it sees $CLUSTER_STATE/nodes/NODE/restart-kubelet);
# waits until the new kubelet answers its health check.
#
# Usage: restart-kubelet.sh NODE
set -euo pipefail
source "$(dirname "$0")/lib.sh"
node=$1
dir=$CLUSTER_STATE/nodes/$node
old=$(recorded_pid "$node-kubelet") || die "$node's kubelet is not running"
touch "$dir/restart-kubelet"
kill -TERM "$old"
for _ in $(seq 1 300); do
  pid=$(recorded_pid "$node-kubelet" 2>/dev/null) || pid=
  if [[ -n $pid && $pid != "$old" ]] && nsenter --net="/run/netns/$(node_netns "$node")" curl -sf http://127.0.0.1:10248/healthz >/dev/null 2>&1; then
    log "$node: kubelet $old restarted as $pid"
    exit 0
  fi
  sleep 0.1
done
die "$node: kubelet did not come back in 30 s"
