# shellcheck shell=bash disable=SC2034
# The cluster's settings and helpers, sourced by every script in scripts/cluster/ and by
# test/cluster/. Each can be overridden from the environment
# (docs/cluster.md, "Settings").

CLUSTER_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# The Kubernetes server binaries: a directory holding kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kube-proxy and agnhost,
# each either as NAME.xz or NAME, and a SHA256SUMS of the uncompressed files.
# A current release's official binaries work the same (a directory of
# uncompressed binaries and their sums).
CLUSTER_K8S_DIR=${CLUSTER_K8S_DIR:-$CLUSTER_ROOT/../shared/kubernetes/v1.24.0-alpha.1}
# Everything built or unpacked (binaries, certificates, images): made again
# only when its input changes.
CLUSTER_CACHE=${CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lbctl/cluster}
# A running cluster's state: etcd's data, the nodes' containerd and kubelet
# directories, logs, pids. Removed by cluster-down.
CLUSTER_STATE=${CLUSTER_STATE:-/var/lib/lbctl-cluster}

# Names on the host: network namespaces (/run/netns), cgroups (under each
# hierarchy of /sys/fs/cgroup). Nothing else the cluster makes is visible in
# the host's namespaces.
CLUSTER_NAME=${CLUSTER_NAME:-lbctl-cluster}
read -r -a CLUSTER_NODES <<<"${CLUSTER_NODES:-node1 node2}"

# Addresses. The control plane's namespace holds the nodes' bridge and the
# API server; node i is .(10+i) on it and owns pod CIDR 10.244.i.0/24.
CLUSTER_NET_PREFIX=${CLUSTER_NET_PREFIX:-10.240.0}
CLUSTER_APISERVER_IP=$CLUSTER_NET_PREFIX.1
CLUSTER_APISERVER_PORT=${CLUSTER_APISERVER_PORT:-6443}
CLUSTER_POD_CIDR=${CLUSTER_POD_CIDR:-10.244.0.0/16}
CLUSTER_SERVICE_CIDR=${CLUSTER_SERVICE_CIDR:-10.96.0.0/16}
CLUSTER_SERVICE_IP=10.96.0.1     # the kubernetes Service: the first address of CLUSTER_SERVICE_CIDR
CLUSTER_DNS_IP=10.96.0.10
CLUSTER_DOMAIN=cluster.local
# How pods reach pods on other nodes. routed: each node routes the other
# nodes' pod CIDRs through their node addresses (the underlay). vxlan: a
# flannel-style overlay, vxlan0 on each node (VNI 1, UDP 8472), holding
# 10.244.i.0/32, the other nodes' pod CIDRs routed through it with static
# ARP and FDB entries, no underlay routes between nodes, and the pods' MTU
# that of vxlan0.
CLUSTER_NETWORK=${CLUSTER_NETWORK:-routed}
case $CLUSTER_NETWORK in routed | vxlan) ;; *) echo "cluster: CLUSTER_NETWORK=$CLUSTER_NETWORK: routed or vxlan" >&2; exit 1 ;; esac

# Our own images, imported into each node's containerd (scripts/cluster/images.sh).
CLUSTER_PAUSE_IMAGE=${CLUSTER_PAUSE_IMAGE:-lbctl.local/pause:1.0}
CLUSTER_TEST_IMAGE=${CLUSTER_TEST_IMAGE:-lbctl.local/agnhost:1.0}
CLUSTER_KUBE_PROXY_IMAGE=${CLUSTER_KUBE_PROXY_IMAGE:-lbctl.local/kube-proxy:v1.24.0-alpha.1}
CLUSTER_DNS_IMAGE=${CLUSTER_DNS_IMAGE:-lbctl.local/cluster-dns:1.0}

# Node i (1-based) of CLUSTER_NODES.
node_index() {
  local i
  for i in "${!CLUSTER_NODES[@]}"; do
    [[ ${CLUSTER_NODES[$i]} == "$1" ]] && { echo $((i + 1)); return; }
  done
  return 1
}
node_ip() { echo "$CLUSTER_NET_PREFIX.$((10 + $(node_index "$1")))"; }
node_pod_cidr() { echo "10.244.$(node_index "$1").0/24"; }
node_netns() { echo "$CLUSTER_NAME-$1"; }
# The overlay (CLUSTER_NETWORK=vxlan): node i's vxlan0 address, the
# gateway the other nodes route its pod CIDR through, and its MAC.
node_vtep_ip() { echo "10.244.$(node_index "$1").0"; }
node_vtep_mac() { printf '0e:4c:42:00:%02x:00\n' "$(node_index "$1")"; }
CLUSTER_CP_NETNS=$CLUSTER_NAME
# A client outside the nodes, as a load balancer or a user elsewhere on the
# nodes' network is: a namespace on the nodes' bridge that knows only that
# network (no route to pods or Services), in cgroup $CLUSTER_NAME/ext.
CLUSTER_EXT_NETNS=$CLUSTER_NAME-ext
CLUSTER_EXT_IP=$CLUSTER_NET_PREFIX.250

# The cgroup v1 hierarchies (each mounted on its own, or several at one
# mount point) and the cgroup2 mount, whatever the host's layout.
cgroup_v1_mounts() { awk '$3 == "cgroup" { print $2 }' /proc/mounts; }
cgroup_v2_mount() { awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts; }

# The cache is shared by every cluster and checkout on the machine: each
# script that writes it holds this lock, and removes another input's
# variant (binaries, certificates, an image) only when no run has used it
# for a day (cache_prune), so that two clusters at once (CLUSTER_NAME) or two
# checkouts never delete what the other is about to use.
cache_lock() {
  mkdir -p "$CLUSTER_CACHE"
  exec 9>"$CLUSTER_CACHE/.lock"
  flock 9
}
# cache_prune KEEP FIND-ARGS...: marks KEEP used now, removes the others matched unused for a day.
cache_prune() {
  local keep=$1; shift
  touch "$keep"
  find "$@" ! -path "$keep" -mmin +1440 -exec rm -rf {} +
}

log() { echo "cluster: $(date +%T.%2N) $*" >&2; }
die() { echo "cluster: $*" >&2; exit 1; }

# Processes the cluster started are recorded as "PID STARTTIME" in
# $CLUSTER_STATE/pids/NAME: the start time (field 22 of /proc/PID/stat) tells
# a recorded process from a later one that reuses its PID.
proc_starttime() { awk '{ sub(/^.*\) /, ""); print $20 }' "/proc/$1/stat" 2>/dev/null; }
record_pid() { # NAME PID
  mkdir -p "$CLUSTER_STATE/pids"
  echo "$2 $(proc_starttime "$2")" >"$CLUSTER_STATE/pids/$1"
}
# The recorded process NAME's PID, if it still runs.
recorded_pid() {
  local f=$CLUSTER_STATE/pids/$1 pid start
  [[ -r $f ]] || return 1
  read -r pid start <"$f"
  [[ -n $pid && $(proc_starttime "$pid") == "$start" ]] && echo "$pid"
}
