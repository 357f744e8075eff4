#!/usr/bin/env bash
# One node: containerd and kubelet, run by up.sh in the node's own network
# namespace, cgroup (enter.sh) and mount and UTS namespaces (unshare). This
# script prepares the mount namespace, writes the node's configuration,
# starts containerd, imports the images (the pause image before kubelet
# starts, the others while it registers), starts kubelet, and waits; SIGTERM
# stops kubelet, then containerd. Everything mounted here lives only in the
# node's mount namespace (private propagation) and goes with its last process.
#
# Usage (from up.sh): node.sh NODE, with CLUSTER_BIN, CLUSTER_PKI and
# CLUSTER_IMAGE_ARCHIVES (space-separated) in the environment.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
node=$1
dir=$CLUSTER_STATE/nodes/$node
ip=$(node_ip "$node")
: "${CLUSTER_BIN:?}" "${CLUSTER_PKI:?}" "${CLUSTER_IMAGE_ARCHIVES:?}"
mkdir -p "$dir"
log "$node: pid $$, $(readlink /proc/self/ns/net), $(readlink /proc/self/ns/mnt)"

# Refuse to go on in the host's mount namespace: every mount below would be
# the host's.
[[ $(readlink /proc/self/ns/mnt) != $(readlink /proc/1/ns/mnt) ]] || die "$node: not in a mount namespace of its own"
[[ $(readlink /proc/self/ns/net) != $(readlink /proc/1/ns/net) ]] || die "$node: not in a network namespace of its own"
hostname "$node"

# sysfs of this network namespace (/sys/class/net shows the node's devices)
# in place of the host's /sys and what is mounted under it, with the host's
# cgroup mounts carried over, and a bpffs of the node's own (pins of one node
# are invisible to the others and to the host).
mkdir -p "$dir/.cgroup"
mount --rbind /sys/fs/cgroup "$dir/.cgroup"
umount -l /sys
mount -t sysfs sysfs /sys
mount --move "$dir/.cgroup" /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf

# /run is the node's: containerd's state and socket, runc's state, the pods'
# network namespaces (/run/netns), xtables.lock.
mount -t tmpfs -o mode=755,size=64m tmpfs /run
# The directories kubelet, containerd and the CNI plugins use at fixed paths
# (kubelet's /var/log/pods and device-plugins, libcni's cache), the node's
# own. up.sh made the mount points.
for d in /var/lib/kubelet /var/lib/containerd /var/lib/cni /var/log/pods /var/log/containers /etc/cni/net.d; do
  mkdir -p "$dir/root$d"
  mount --bind "$dir/root$d" "$d"
done

# The node's cgroup2 subtree at a path of its own: a DaemonSet that needs
# "the node's cgroup2 root" (lbctl's socket hooks) mounts this hostPath, and
# attaches to the node's subtree, never to the host's root.
mkdir -p /run/lbctl-cluster/cgroup2
mount --bind "$(cgroup_v2_mount)/$CLUSTER_NAME/$node" /run/lbctl-cluster/cgroup2

# kubelet sets six kernel sysctls at start (setupKernelTunables). They are
# global, not per network namespace: here each /proc/sys file is covered by a
# plain file holding the host's value, so kubelet reads and writes the file
# and the kernel's values stay the host's.
mkdir -p "$dir/sysctl"
for s in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops \
  kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
  f=$dir/sysctl/${s//\//.}
  cat "/proc/sys/$s" >"$f"
  mount --bind "$f" "/proc/sys/$s"
done
# Nothing on the node loads kernel modules: modprobe (kmod, which it links
# to) records what was asked and succeeds.
cat >"$dir/modprobe" <<MP
#!/bin/sh
echo "\$(date +%FT%T) \$(basename "\$0") \$*" >>"$dir/modprobe.log"
exit 0
MP
chmod 755 "$dir/modprobe"
mount --bind "$dir/modprobe" "$(readlink -f /sbin/modprobe)"

# Shared within the node, as a systemd host's mounts are: a pod's hostPath
# with mountPropagation HostToContainer or Bidirectional (lbctl's bpffs
# mount) needs its source on a shared mount (containerd refuses it on a
# private one). The peer group is the node's own: everything above was made
# private first, so nothing propagates to or from the host.
mount --make-rshared /

# The host's resolver is not the node's: no upstream DNS.
echo "# lbctl cluster node $node: no upstream resolver" >"$dir/resolv.conf"

# ---------------------------------------------------------------- CNI
# bridge + host-local on the node's pod CIDR; up.sh routes the other
# nodes' pod CIDRs through their node addresses, or through vxlan0
# (CLUSTER_NETWORK=vxlan), whose MTU the pods then get: a full-sized frame
# from a pod would not fit in the overlay's.
mtu=1500
[[ $CLUSTER_NETWORK != vxlan ]] || mtu=$(ip -o link show dev vxlan0 2>/dev/null | sed -n 's/.* mtu \([0-9]*\) .*/\1/p' || true)
[[ -n $mtu ]] || die "$node: no vxlan0 (CLUSTER_NETWORK=vxlan): up.sh makes it"
cat >/etc/cni/net.d/10-lbctl.conflist <<CNI
{
  "cniVersion": "0.4.0",
  "name": "lbctl",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true, "mtu": $mtu,
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "$(node_pod_cidr "$node")" }]],
                "routes": [{ "dst": "0.0.0.0/0" }] }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
CNI

# ---------------------------------------------------------------- containerd
cat >"$dir/containerd.toml" <<TOML
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
# Plugins that would probe or load kernel modules (aufs), need devices
# (devmapper, btrfs, zfs) or make /opt/containerd on the host (opt).
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.opt",
]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$CLUSTER_PAUSE_IMAGE"
  # No container's oom_score_adj below containerd's own: lowering it takes
  # CAP_SYS_RESOURCE, which a sandbox may not grant even to root (the
  # sandboxes, -998 otherwise, and Guaranteed pods, -997, would fail).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
TOML

stop() {
  log "$node: stopping"
  [[ -z ${kubelet_pid:-} ]] || kill -TERM "$kubelet_pid" 2>/dev/null || true
  [[ -z ${kubelet_pid:-} ]] || wait "$kubelet_pid" 2>/dev/null || true
  [[ -z ${containerd_pid:-} ]] || kill -TERM "$containerd_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  exit 0
}
trap stop TERM INT

containerd --config "$dir/containerd.toml" >>"$CLUSTER_STATE/logs/$node-containerd.log" 2>&1 &
containerd_pid=$!
record_pid "$node-containerd" "$containerd_pid"
for _ in $(seq 1 100); do
  ctr --address /run/containerd/containerd.sock version >/dev/null 2>&1 && break
  kill -0 "$containerd_pid" 2>/dev/null || die "$node: containerd exited (logs/$node-containerd.log)"
  sleep 0.1
done
# The first archive is the sandbox image (images.sh prints it first): kubelet
# needs it for the first pod. The others are imported while kubelet
# registers; up.sh waits for images-ready.
import_image() { ctr --address /run/containerd/containerd.sock -n k8s.io images import "$1" >/dev/null; }
read -r -a archives <<<"$CLUSTER_IMAGE_ARCHIVES"
import_image "${archives[0]}"

# ---------------------------------------------------------------- kubelet
cat >"$dir/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: true }
  x509: { clientCAFile: $CLUSTER_PKI/ca.crt }
authorization: { mode: Webhook }
tlsCertFile: $CLUSTER_PKI/$node-serving.crt
tlsPrivateKeyFile: $CLUSTER_PKI/$node-serving.key
# Pods' cgroups under the node's own subtree, in every hierarchy.
cgroupDriver: cgroupfs
cgroupRoot: /$CLUSTER_NAME/$node
cgroupsPerQOS: true
clusterDomain: $CLUSTER_DOMAIN
clusterDNS: [$CLUSTER_DNS_IP]
resolvConf: $dir/resolv.conf
protectKernelDefaults: false
# The nodes share the host's disk and memory: evict only when nearly out,
# and never collect images (ours cannot be pulled again).
evictionHard: { memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1% }
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# How often kubelet checks its node's status; it writes it only when it
# changed (or every nodeStatusReportFrequency, 5 min). At the default 10 s
# the node's first status (not Ready: no PLEG relist yet) stood for 10 s.
nodeStatusUpdateFrequency: 1s
YAML
start_kubelet() {
  "$CLUSTER_BIN/kubelet" --config="$dir/kubelet.yaml" --kubeconfig="$CLUSTER_PKI/$node.kubeconfig" \
    --container-runtime=remote --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
    --pod-infra-container-image="$CLUSTER_PAUSE_IMAGE" \
    --hostname-override="$node" --node-ip="$ip" --v="${CLUSTER_KUBELET_V:-1}" \
    >>"$CLUSTER_STATE/logs/$node-kubelet.log" 2>&1 &
  kubelet_pid=$!
  record_pid "$node-kubelet" "$kubelet_pid"
}
start_kubelet
log "$node: containerd $containerd_pid, kubelet $kubelet_pid"
for a in "${archives[@]:1}"; do import_image "$a"; done
log "$node: images $(ctr --address /run/containerd/containerd.sock -n k8s.io images ls -q | grep -v '^sha256:' | tr '\n' ' ')"
touch "$dir/images-ready"
# kubelet is started again when it exits with $dir/restart-kubelet present
# (restart-kubelet.sh: what `systemctl restart kubelet` does on a systemd
# host); any other exit of kubelet or containerd stops the node.
while wait -n "$containerd_pid" "$kubelet_pid" || true; do
  kill -0 "$containerd_pid" 2>/dev/null || break
  kill -0 "$kubelet_pid" 2>/dev/null && continue
  [[ -e $dir/restart-kubelet ]] || break
  rm -f "$dir/restart-kubelet"
  start_kubelet
  log "$node: kubelet restarted: $kubelet_pid"
done
log "$node: containerd or kubelet exited"
stop
