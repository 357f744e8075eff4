#!/usr/bin/env bash
# `make cluster-down`: removes what up.sh made, whether it finished or not,
# and nothing else:
#   1. the processes it recorded in $CLUSTER_STATE/pids (checked by start
#      time), kubelets first, then the nodes, then the control plane: SIGTERM,
#      then SIGKILL after a grace period;
#   2. what is left in the cluster's cgroups: the containerd shims and the
#      pods' processes, which only the cluster's own processes started;
#   3. the cgroups, the network namespaces, the host's empty mount points
#      up.sh made, and $CLUSTER_STATE (its logs are kept in
#      $CLUSTER_CACHE/last-logs).
# The nodes' mounts live in the nodes' mount namespaces and go with their
# last process.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
[[ $(id -u) -eq 0 ]] || die "needs root"

# stop SECONDS NAME...: SIGTERM to each recorded process still running, wait,
# then SIGKILL.
stop() {
  local secs=$1 name pid live=() i
  shift
  for name in "$@"; do
    pid=$(recorded_pid "$name") || continue
    kill -TERM "$pid" 2>/dev/null && live+=("$pid")
  done
  for ((i = 0; i < secs * 10 && ${#live[@]}; i++)); do
    sleep 0.1
    local still=()
    for pid in "${live[@]}"; do [[ -d /proc/$pid ]] && still+=("$pid"); done
    live=("${still[@]+"${still[@]}"}")
  done
  for pid in "${live[@]+"${live[@]}"}"; do
    log "pid $pid did not stop in $secs s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  done
}

if [[ -d $CLUSTER_STATE/pids ]]; then
  nodes=()
  for f in "$CLUSTER_STATE"/pids/*-kubelet; do [[ -e $f ]] && nodes+=("${f##*/}"); done
  stop 10 "${nodes[@]+"${nodes[@]}"}"
  nodes=()
  for n in "${CLUSTER_NODES[@]}"; do nodes+=("$n-containerd" "$n"); done
  stop 10 "${nodes[@]}"
  stop 10 kube-scheduler kube-controller-manager
  stop 15 kube-apiserver
  stop 10 etcd
fi

# What is left in the cluster's cgroups was started by the cluster's own
# processes (shims, pods). Frozen first, where the freezer is, so nothing
# forks while it is killed.
cgroup_procs() { find "$1" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u; }
freezer=$(awk '$3 == "cgroup" && $4 ~ /(^|,)freezer(,|$)/ { print $2; exit }' /proc/mounts)
for m in $(cgroup_v1_mounts) $(cgroup_v2_mount); do
  top=$m/$CLUSTER_NAME
  [[ -d $top ]] || continue
  for ((i = 0; i < 50; i++)); do
    pids=$(cgroup_procs "$top")
    [[ -z $pids ]] && break
    ((i > 0)) || log "killing $(wc -w <<<"$pids") processes left in $top"
    [[ $m != "$freezer" ]] || echo FROZEN >"$top/freezer.state" 2>/dev/null || true
    kill -KILL $pids 2>/dev/null || true
    [[ $m != "$freezer" ]] || echo THAWED >"$top/freezer.state" 2>/dev/null || true
    sleep 0.1
  done
  # Leaves first.
  find "$top" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  [[ ! -d $top ]] || log "could not remove $top: $(cgroup_procs "$top" | wc -l) processes left"
done

for n in "${CLUSTER_NODES[@]}"; do
  ns=$(node_netns "$n")
  [[ ! -e /run/netns/$ns ]] || ip netns del "$ns"
done
[[ ! -e /run/netns/$CLUSTER_CP_NETNS ]] || ip netns del "$CLUSTER_CP_NETNS"

if [[ -d $CLUSTER_STATE ]]; then
  if [[ -f $CLUSTER_STATE/host-dirs ]]; then
    # Deepest first (the reverse of their making); only while still empty.
    tac "$CLUSTER_STATE/host-dirs" | while read -r d; do rmdir "$d" 2>/dev/null || true; done
  fi
  # Nothing of the cluster is mounted in the host's namespace; refuse to
  # delete through a mount all the same.
  if findmnt -rno TARGET | grep -q "^$CLUSTER_STATE"; then
    die "mounts under $CLUSTER_STATE in the host's namespace: not removing it"
  fi
  if [[ -d $CLUSTER_STATE/logs ]]; then
    rm -rf "$CLUSTER_CACHE/last-logs"
    mkdir -p "$CLUSTER_CACHE"
    mv "$CLUSTER_STATE/logs" "$CLUSTER_CACHE/last-logs"
  fi
  rm -rf "$CLUSTER_STATE"
fi
log "down"
