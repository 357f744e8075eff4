#!/usr/bin/env bash
# `make cluster-up`: a Kubernetes cluster on this machine, isolated from the
# host (docs/cluster.md):
#
#   netns lbctl-cluster         the control plane: etcd (127.0.0.1 only),
#                               kube-apiserver, kube-controller-manager,
#                               kube-scheduler; the bridge br0 the nodes hang
#                               on (10.240.0.1/24)
#   netns lbctl-cluster-NODE    a node: containerd, kubelet, its pods on cni0;
#                               eth0 10.240.0.(10+i), pod CIDR 10.244.i.0/24;
#                               with CLUSTER_NETWORK=vxlan, vxlan0 10.244.i.0/32
#   netns lbctl-cluster-ext     a client outside the nodes, on br0 (.250)
#   cgroup lbctl-cluster/{control-plane,NODE,ext} under every hierarchy: each
#                               node's processes and pods stay in its subtree
#
# Every process it starts is recorded (pid and start time) in
# $CLUSTER_STATE/pids; cluster-down stops those, then what is left in the
# cluster's cgroups, and removes the rest. A failed start stops at the
# first process that exits or does not become ready, and says which: what
# was made stays for a look (the logs in $CLUSTER_STATE/logs) until
# cluster-down.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
t0=$EPOCHREALTIME
elapsed() { awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

[[ $(id -u) -eq 0 ]] || die "needs root"
if [[ -e $CLUSTER_STATE ]] || [[ -e /run/netns/$CLUSTER_CP_NETNS ]]; then
  die "a cluster is up, or an old one was not removed ($CLUSTER_STATE, /run/netns/$CLUSTER_CP_NETNS): make cluster-down"
fi
v2=$(cgroup_v2_mount)
[[ -n $v2 ]] || die "no cgroup2 mount: the cluster needs one for the nodes' subtrees"

# ---------------------------------------------------------------- inputs (cached)
bin=$("$here/binaries.sh")
pki=$("$here/pki.sh")
mapfile -t archives < <("$here/images.sh")
log "inputs ready ($(elapsed) s): $bin, $pki"

mkdir -p "$CLUSTER_STATE"/{logs,pids}
cp "$pki/admin.kubeconfig" "$CLUSTER_STATE/admin.kubeconfig"
export PATH="$bin:$PATH"

# ---------------------------------------------------------------- host mount points
# Empty directories on the host where each node mounts its own (node.sh);
# those made here are removed by cluster-down.
for d in /var/lib/kubelet /var/lib/containerd /var/lib/cni /var/log/pods /var/log/containers /etc/cni/net.d; do
  while [[ ! -d $d ]]; do
    p=$d
    while [[ ! -d $(dirname "$p") ]]; do p=$(dirname "$p"); done
    mkdir "$p"
    echo "$p" >>"$CLUSTER_STATE/host-dirs"
  done
  # A mark of this cluster in the host's view of each (the node's mount
  # hides it): another cluster's cluster-down, whose rmdir would detach
  # this cluster's nodes' mounts there, finds it not empty and leaves it.
  touch "$d/.$CLUSTER_NAME"
done

# ---------------------------------------------------------------- cgroups
# A subtree under every hierarchy. cpuset children start empty: they get
# the parent's CPUs and memory nodes before any process joins.
groups=(control-plane "${CLUSTER_NODES[@]}" ext)
for m in $(cgroup_v1_mounts) "$v2"; do
  mkdir -p "$m/$CLUSTER_NAME"
  for g in "${groups[@]}"; do mkdir -p "$m/$CLUSTER_NAME/$g"; done
  if [[ -f $m/cpuset.cpus ]]; then
    for c in "$m/$CLUSTER_NAME" "${groups[@]/#/$m/$CLUSTER_NAME/}"; do
      [[ -n $(cat "$c/cpuset.cpus") ]] || cat "$(dirname "$c")/cpuset.cpus" >"$c/cpuset.cpus"
      [[ -n $(cat "$c/cpuset.mems") ]] || cat "$(dirname "$c")/cpuset.mems" >"$c/cpuset.mems"
    done
  fi
done

# ---------------------------------------------------------------- network
# Made inside the namespaces (ip -n): the host's namespace never gets a
# device, address, route or sysctl.
cp_ns=$CLUSTER_CP_NETNS
ip netns add "$cp_ns"
ip -n "$cp_ns" link set lo up
ip -n "$cp_ns" link add br0 type bridge
ip -n "$cp_ns" addr add "$CLUSTER_APISERVER_IP/24" dev br0
ip -n "$cp_ns" link set br0 up
for n in "${CLUSTER_NODES[@]}"; do
  ns=$(node_netns "$n")
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$cp_ns" link add "$n" type veth peer name eth0 netns "$ns"
  ip -n "$cp_ns" link set "$n" master br0 up
  ip -n "$ns" addr add "$(node_ip "$n")/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route add default via "$CLUSTER_APISERVER_IP"
  # Per network namespace: the node routes for its pods.
  nsenter --net="/run/netns/$ns" sysctl -qw net.ipv4.ip_forward=1
  # The control plane reaches pods (webhooks, kubectl proxy) through their node.
  ip -n "$cp_ns" route add "$(node_pod_cidr "$n")" via "$(node_ip "$n")"
done
# The external client: on the bridge, with no route beyond its subnet.
ip netns add "$CLUSTER_EXT_NETNS"
ip -n "$CLUSTER_EXT_NETNS" link set lo up
ip -n "$cp_ns" link add ext type veth peer name eth0 netns "$CLUSTER_EXT_NETNS"
ip -n "$cp_ns" link set ext master br0 up
ip -n "$CLUSTER_EXT_NETNS" addr add "$CLUSTER_EXT_IP/24" dev eth0
ip -n "$CLUSTER_EXT_NETNS" link set eth0 up
if [[ $CLUSTER_NETWORK == routed ]]; then
  # Pod to pod across nodes over the underlay: the other nodes' pod CIDRs
  # through their node addresses.
  for n in "${CLUSTER_NODES[@]}"; do
    for m in "${CLUSTER_NODES[@]}"; do
      [[ $n == "$m" ]] || ip -n "$(node_netns "$n")" route add "$(node_pod_cidr "$m")" via "$(node_ip "$m")"
    done
  done
else
  # The VXLAN overlay, as flannel's vxlan backend makes it: vxlan0 (VNI 1,
  # UDP 8472, over eth0) holds 10.244.i.0/32; each other node's pod CIDR
  # is routed via that node's 10.244.m.0 on vxlan0 (onlink), whose MAC is a
  # static neighbour entry and whose node address the FDB entry for that
  # MAC names (no learning). No underlay route between nodes' pod CIDRs.
  for n in "${CLUSTER_NODES[@]}"; do
    ns=$(node_netns "$n")
    ip -n "$ns" link add vxlan0 address "$(node_vtep_mac "$n")" type vxlan id 1 dstport 8472 \
      local "$(node_ip "$n")" dev eth0 nolearning
    ip -n "$ns" addr add "$(node_vtep_ip "$n")/32" dev vxlan0
    ip -n "$ns" link set vxlan0 up
    for m in "${CLUSTER_NODES[@]}"; do
      [[ $n != "$m" ]] || continue
      ip -n "$ns" neigh add "$(node_vtep_ip "$m")" lladdr "$(node_vtep_mac "$m")" dev vxlan0 nud permanent
      bridge -n "$ns" fdb append "$(node_vtep_mac "$m")" dev vxlan0 dst "$(node_ip "$m")" self permanent
      ip -n "$ns" route add "$(node_pod_cidr "$m")" via "$(node_vtep_ip "$m")" dev vxlan0 onlink
    done
  done
fi

# spawn NAME GROUP NETNS CMD...: CMD in the background, in the cluster's
# cgroup GROUP and namespace NETNS, its own session, its pid recorded.
spawn() {
  local name=$1 group=$2 netns=$3
  shift 3
  setsid "$here/enter.sh" "$group" "$netns" "$@" </dev/null >>"$CLUSTER_STATE/logs/$name.log" 2>&1 &
  record_pid "$name" $!
}
cpx() { nsenter --net="/run/netns/$cp_ns" "$@"; }
# A recorded process that exited: the start has failed, say which and why.
check_alive() {
  local f name dead=()
  for f in "$CLUSTER_STATE"/pids/*; do
    name=${f##*/}
    recorded_pid "$name" >/dev/null || dead+=("$name")
  done
  ((${#dead[@]})) || return 0
  for name in "${dead[@]}"; do
    tail -n 8 "$CLUSTER_STATE/logs/$name.log" 2>/dev/null | cut -c1-300 | sed "s/^/  $name: /" >&2 || true
  done
  die "exited: ${dead[*]} (logs in $CLUSTER_STATE/logs); make cluster-down removes what was made"
}
# wait_for WHAT SECONDS CMD...: until CMD succeeds, while every process runs.
wait_for() {
  local what=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 5; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    ((i % 5)) || check_alive
    sleep 0.2
  done
  die "$what not ready after ${secs} s (logs in $CLUSTER_STATE/logs); make cluster-down removes what was made"
}
api_ok() {
  cpx curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "https://$CLUSTER_APISERVER_IP:$CLUSTER_APISERVER_PORT/$1"
}

# ---------------------------------------------------------------- control plane
spawn etcd control-plane "$cp_ns" etcd --name lbctl-cluster --data-dir "$CLUSTER_STATE/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster lbctl-cluster=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
  --snapshot-count 10000 --log-level warn
wait_for etcd 30 cpx curl -sf http://127.0.0.1:2381/health

spawn kube-apiserver control-plane "$cp_ns" kube-apiserver \
  --advertise-address="$CLUSTER_APISERVER_IP" --secure-port="$CLUSTER_APISERVER_PORT" \
  --etcd-servers=http://127.0.0.1:2379 \
  --service-cluster-ip-range="$CLUSTER_SERVICE_CIDR" \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" \
  --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$pki/ca.crt" \
  --kubelet-preferred-address-types=InternalIP \
  --service-account-issuer="https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --allow-privileged=true --profiling=false --v=1
wait_for kube-apiserver 90 api_ok readyz

spawn kube-controller-manager control-plane "$cp_ns" kube-controller-manager \
  --kubeconfig="$pki/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$pki/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$pki/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
  --root-ca-file="$pki/ca.crt" --service-account-private-key-file="$pki/sa.key" \
  --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
  --service-cluster-ip-range="$CLUSTER_SERVICE_CIDR" --cluster-cidr="$CLUSTER_POD_CIDR" \
  --allocate-node-cidrs=false --profiling=false --v=1
spawn kube-scheduler control-plane "$cp_ns" kube-scheduler \
  --kubeconfig="$pki/scheduler.kubeconfig" \
  --authentication-kubeconfig="$pki/scheduler.kubeconfig" \
  --authorization-kubeconfig="$pki/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false --profiling=false --v=1
log "control plane up ($(elapsed) s)"

# ---------------------------------------------------------------- nodes
for n in "${CLUSTER_NODES[@]}"; do
  CLUSTER_BIN=$bin CLUSTER_PKI=$pki CLUSTER_IMAGE_ARCHIVES="${archives[*]}" CLUSTER_NETWORK=$CLUSTER_NETWORK \
    spawn "$n" "$n" "$(node_netns "$n")" unshare --mount --uts --propagation private -- "$here/node.sh" "$n"
done

kubectl=$("$here/kubectl.sh" --path)
k() { cpx "$kubectl" --kubeconfig "$CLUSTER_STATE/admin.kubeconfig" "$@"; }
for n in "${CLUSTER_NODES[@]}"; do
  wait_for "node $n (registration)" 120 k get node "$n"
  # The node's pod CIDR, as the CNI configuration has it (set once, by us:
  # the controller-manager does not allocate).
  k patch node "$n" --type merge -p "{\"spec\":{\"podCIDR\":\"$(node_pod_cidr "$n")\",\"podCIDRs\":[\"$(node_pod_cidr "$n")\"]}}" >/dev/null
done
for n in "${CLUSTER_NODES[@]}"; do
  wait_for "node $n (Ready)" 120 k wait --for=condition=Ready "node/$n" --timeout=1s
  wait_for "node $n (images)" 120 test -e "$CLUSTER_STATE/nodes/$n/images-ready"
done
# Pods can be created once their namespace's default ServiceAccount is
# (the controller-manager makes it, a moment after it starts).
wait_for "the default ServiceAccount" 60 k -n default get serviceaccount default
# The cluster's DNS, behind 10.96.0.10: it answers once a proxy serves
# Services (kube-proxy.sh, lbctl.sh), as CoreDNS would.
sed -e "s|@IMAGE@|$CLUSTER_DNS_IMAGE|" -e "s|@APISERVER@|$CLUSTER_APISERVER_IP:$CLUSTER_APISERVER_PORT|" \
  -e "s|@DOMAIN@|$CLUSTER_DOMAIN|" -e "s|@DNS_IP@|$CLUSTER_DNS_IP|" "$here/manifests/cluster-dns.yaml" | k apply -f - >/dev/null
log "cluster up in $(elapsed) s: ${CLUSTER_NODES[*]} Ready"
log "kubectl: scripts/cluster/kubectl.sh get nodes (KUBECONFIG $CLUSTER_STATE/admin.kubeconfig, from netns $cp_ns)"
