#!/usr/bin/env bash
# `make cluster-down`: removes what up.sh made, whether it finished or not,
# and nothing else:
#   1. the processes it recorded in $CLUSTER_STATE/pids (checked by start
#      time): the kubelets and controllers (SIGTERM, SIGKILL after a grace
#      period), each node's processes with everything in its cgroup (the
#      containerd shims and the pods, which only the node's own processes
#      started), then kube-apiserver and etcd;
#   2. the cgroups, the network namespaces, the host's empty mount points
#      up.sh made, and $CLUSTER_STATE (its logs are kept in
#      $CLUSTER_CACHE/last-logs).
# The nodes' mounts live in the nodes' mount namespaces and go with their
# last process.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
[[ $(id -u) -eq 0 ]] || die "needs root"

# A process that ran and is not yet a zombie.
alive() { [[ $(awk '{ sub(/^.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null) =~ ^[^ZX]$ ]]; }

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
    for pid in "${live[@]}"; do alive "$pid" && still+=("$pid"); done
    live=("${still[@]+"${still[@]}"}")
  done
  for pid in "${live[@]+"${live[@]}"}"; do
    log "pid $pid ($(cat /proc/$pid/comm 2>/dev/null)) did not stop in $secs s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# kill_cgroup DIR: every process in the cgroup DIR and below (cgroup2 DIR).
# cgroup.kill (Linux 5.14) does it at once; otherwise they are frozen where
# the v1 freezer is, so nothing forks while they are killed, and killed.
cgroup_procs() { find "$1" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u; }
freezer=$(awk '$3 == "cgroup" && $4 ~ /(^|,)freezer(,|$)/ { print $2; exit }' /proc/mounts)
kill_cgroup() {
  local dir=$1 fz i pids
  [[ -d $dir ]] || return 0
  if [[ -f $dir/cgroup.kill ]]; then echo 1 >"$dir/cgroup.kill"; fi
  fz=$freezer${dir#"$(cgroup_v2_mount)"}
  for ((i = 0; i < 50; i++)); do
    pids=$(cgroup_procs "$dir")
    [[ -n $pids ]] || return 0
    [[ ! -f $fz/freezer.state ]] || echo FROZEN >"$fz/freezer.state" 2>/dev/null || true
    kill -KILL $pids 2>/dev/null || true
    [[ ! -f $fz/freezer.state ]] || echo THAWED >"$fz/freezer.state" 2>/dev/null || true
    sleep 0.1
  done
}
v2top=$(cgroup_v2_mount)/$CLUSTER_NAME

if [[ -d $CLUSTER_STATE/pids ]]; then
  # The kubelets first, so none restarts a pod while its node goes, and the
  # controllers, which keep no state of their own: a second for them
  # (kube-scheduler 1.24 does not exit on SIGTERM at all).
  kubelets=()
  for n in "${CLUSTER_NODES[@]}"; do kubelets+=("$n-kubelet"); done
  stop 1 kube-scheduler kube-controller-manager
  stop 5 "${kubelets[@]}"
fi
# The nodes: node.sh, containerd, the shims and the pods, all in the node's
# cgroup; their state is thrown away, so there is nothing to wait for.
for n in "${CLUSTER_NODES[@]}"; do
  for name in "$n-containerd" "$n"; do
    pid=$(recorded_pid "$name" 2>/dev/null) && kill -KILL "$pid" 2>/dev/null || true
  done
  kill_cgroup "$v2top/$n"
done
if [[ -d $CLUSTER_STATE/pids ]]; then
  stop 5 kube-apiserver
  stop 5 etcd
fi
# Anything left anywhere in the cluster's cgroups, then the cgroups, leaves
# first.
kill_cgroup "$v2top"
for m in $(cgroup_v1_mounts) $(cgroup_v2_mount); do
  top=$m/$CLUSTER_NAME
  [[ -d $top ]] || continue
  # shellcheck disable=SC2046 # one PID a word
  [[ -z $(cgroup_procs "$top") ]] || { log "killing what is left in $top"; kill -KILL $(cgroup_procs "$top") 2>/dev/null || true; sleep 0.2; }
  find "$top" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  [[ ! -d $top ]] || log "could not remove $top: $(cgroup_procs "$top" | wc -l) processes left"
done

for n in "${CLUSTER_NODES[@]}"; do
  ns=$(node_netns "$n")
  [[ ! -e /run/netns/$ns ]] || ip netns del "$ns"
done
[[ ! -e /run/netns/$CLUSTER_EXT_NETNS ]] || ip netns del "$CLUSTER_EXT_NETNS"
[[ ! -e /run/netns/$CLUSTER_CP_NETNS ]] || ip netns del "$CLUSTER_CP_NETNS"

# This cluster's marks in the host's mount points (up.sh).
for d in /var/lib/kubelet /var/lib/containerd /var/lib/cni /var/log/pods /var/log/containers /etc/cni/net.d; do
  rm -f "$d/.$CLUSTER_NAME"
done
# A mount point in some mount namespace: another cluster's node uses it.
mounted_anywhere() { { cat /proc/[0-9]*/mountinfo 2>/dev/null || true; } | awk -v d="$1" '$5 == d { f = 1 } END { exit !f }'; }
if [[ -d $CLUSTER_STATE ]]; then
  if [[ -f $CLUSTER_STATE/host-dirs ]]; then
    # Deepest first (the reverse of their making); only while still empty
    # (no other cluster's mark) and mounted in no node.
    tac "$CLUSTER_STATE/host-dirs" | while read -r d; do
      mounted_anywhere "$d" || rmdir "$d" 2>/dev/null || true
    done
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
