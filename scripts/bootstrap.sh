#!/usr/bin/env bash
# Installs what lbctl needs to build, test and demo (and, with --bench, to
# benchmark; with --image, to build the container image; with --cluster, to
# run the real cluster), and only what is missing.
# Idempotent: a second run on a ready machine installs nothing and touches no
# network. Debian packages first, then Node.js 24 into its private prefix
# (scripts/install-node.sh, scripts/node.env; a Node the machine has stays
# untouched and unused), then `npm ci` with it when node_modules is stale.
set -euo pipefail
cd "$(dirname "$0")/.."

# command-or-file  debian-package
need=(
  "clang:clang"
  "llc:llvm"
  "llvm-strip:llvm"
  "/usr/include/bpf/libbpf.h:libbpf-dev"
  "/usr/include/libelf.h:libelf-dev"
  "/usr/include/zlib.h:zlib1g-dev"
  "bpftool:bpftool"
  "ip:iproute2"
  "tc:iproute2"
  "curl:curl"
  # scripts/install-node.sh downloads Node.js over https (curl only recommends them)
  "/etc/ssl/certs/ca-certificates.crt:ca-certificates"
  "dig:dnsutils"
  "dnsmasq:dnsmasq-base"
  "socat:socat"
  # test/e2e/nodeport-networks.ts: a WireGuard overlay between two node namespaces (its keys)
  "wg:wireguard-tools"
  # test/e2e/nodeport-xdp.ts: the lab's senders send whole checksums, as a wire does
  "ethtool:ethtool"
  # test/deploy/cleanup-kube-proxy.ts: kube-proxy's rules in both iptables backends and nftables
  "iptables-legacy-restore:iptables"
  "iptables-nft-restore:iptables"
  "nft:nftables"
  "python3:python3"
  "make:make"
  "g++:g++"
  "pkg-config:pkg-config"
)
# `make bench` also needs kube-proxy's tools (to emulate its modes), a C
# compiler for the client and server it builds at run time, and gnuplot.
if [[ ${1:-} == --bench ]]; then
  need+=(
    "iptables-legacy-restore:iptables"
    "iptables-nft-restore:iptables"
    "nft:nftables"
    "cc:gcc"
    "taskset:util-linux"
    "gnuplot:gnuplot-nox"
  )
fi

# `make image` (scripts/image/build.sh): a Debian rootfs and its OCI image,
# with no container engine. mmtarfilter comes with mmdebstrap.
if [[ ${1:-} == --image ]]; then
  need+=(
    "mmdebstrap:mmdebstrap"
    "mmtarfilter:mmdebstrap"
    "umoci:umoci"
  )
fi

# `make cluster-up` (scripts/cluster/, docs/cluster.md): etcd, containerd,
# runc and the CNI plugins run the cluster; the Kubernetes binaries come
# from ../shared/kubernetes. openssl makes its certificates; gcc, a static
# busybox, mmdebstrap (kube-proxy's iptables and conntrack) and umoci its
# images.
if [[ ${1:-} == --cluster ]]; then
  need+=(
    "etcd:etcd-server"
    "containerd:containerd"
    "ctr:containerd"
    "runc:runc"
    "/usr/lib/cni/bridge:containernetworking-plugins"
    "/usr/lib/cni/host-local:containernetworking-plugins"
    "openssl:openssl"
    "xz:xz-utils"
    "cc:gcc"
    "busybox:busybox-static"
    "mmdebstrap:mmdebstrap"
    "umoci:umoci"
  )
fi

missing=()
for pair in "${need[@]}"; do
  what=${pair%%:*} pkg=${pair#*:}
  if [[ $what == /* ]]; then
    [[ -e $what ]] && continue
  else
    # bpftool lives in /usr/sbin, which a non-login root shell may not have on PATH
    command -v "$what" >/dev/null 2>&1 || [[ -x /usr/sbin/$what ]] && continue
  fi
  [[ " ${missing[*]} " == *" $pkg "* ]] || missing+=("$pkg")
done

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "bootstrap: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # etcd-server's and containerd's packages start their service where the
  # machine lets them (no /usr/sbin/policy-rc.d denying it): the cluster
  # runs its own in namespaces and needs none on the host.
  if [[ ${1:-} == --cluster ]]; then
    rc=0
    [[ -x /usr/sbin/policy-rc.d ]] && { /usr/sbin/policy-rc.d etcd start >/dev/null 2>&1 || rc=$?; }
    ((rc == 101)) || echo "bootstrap: the packages may have started etcd or containerd on the host; make cluster-up does not use them" >&2
  fi
fi

# Node.js: the version of scripts/node.env in its own prefix; the Makefile
# puts LBCTL_NODE_PREFIX/bin first on PATH, and so does this script for npm ci.
bash scripts/install-node.sh
. scripts/node.env
export PATH=$LBCTL_NODE_PREFIX/bin:$PATH

# npm ci only when package-lock.json changed since the last install.
if [[ -f package-lock.json ]]; then
  stamp=node_modules/.lbctl-lock-hash
  want=$(sha256sum package-lock.json | cut -d' ' -f1)
  if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    echo "bootstrap: npm ci"
    npm ci --no-audit --no-fund --ignore-scripts
    echo "$want" >"$stamp"
  fi
fi
