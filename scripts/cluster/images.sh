#!/usr/bin/env bash
# The cluster's own images, built without a container engine or registry
# and cached: each archive's name holds a hash of its inputs, so it is built
# again only when they change. Prints one archive path a line, the pause
# image's first (node.sh imports it before kubelet starts).
#
#   pause    CLUSTER_PAUSE_IMAGE: images/pause.c, static; the sandbox image
#            every node's containerd names (sandbox_image)
#   agnhost  CLUSTER_TEST_IMAGE: Kubernetes' agnhost (the shared binary, static)
#            as /agnhost, the entrypoint, and busybox (static) for a shell
#            and nc
#   cluster-dns CLUSTER_DNS_IMAGE: images/cluster-dns.mjs (the cluster's DNS
#            server) and Debian bookworm's nodejs, with its libraries
#   kube-proxy  CLUSTER_KUBE_PROXY_IMAGE: the shared kube-proxy (static) and
#            what it runs: iptables (its nft backend, as the nodes' own
#            iptables is) and conntrack, with their libraries, from Debian
#            bookworm's packages (mmdebstrap --variant=extract: files only,
#            no maintainer scripts; the alternatives' links made here)
#
# Each is an OCI image layout made with umoci and tarred (an oci-archive),
# its index naming the image (io.containerd.image.name), so that
# `ctr -n k8s.io images import FILE` gives the image its name.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
# images.sh: the cluster's own; images.sh e2e: e2e.test's as well (printed
# after them).
set=${1:-}
for tool in umoci gcc busybox mmdebstrap; do
  command -v "$tool" >/dev/null || die "$tool is missing (scripts/bootstrap.sh --cluster installs it)"
done
# busybox-static's: the image has no libc for a dynamic one.
! ldd "$(command -v busybox)" >/dev/null 2>&1 || die "$(command -v busybox) is not static (Debian's busybox-static is)"
bindir=$("$here/binaries.sh" agnhost kube-proxy)
out=$CLUSTER_CACHE/images
mkdir -p "$out"
cache_lock
work=$(mktemp -d "${TMPDIR:-/tmp}/lbctl-cluster-images.XXXXXX")
trap 'rm -rf "$work"' EXIT

# oci_archive OUT NAME:TAG ROOTFS UMOCI-CONFIG-ARG...: one layer, the rootfs.
oci_archive() {
  local dest=$1 ref=$2 rootfs=$3 tag=${2##*:} layout=$work/layout
  shift 3
  rm -rf "$layout"
  tar -C "$rootfs" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$work/layer.tar" .
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci raw add-layer --image "$layout:$tag" --history.created 1970-01-01T00:00:00Z "$work/layer.tar"
  umoci config --image "$layout:$tag" --created 1970-01-01T00:00:00Z --author lbctl \
    --os linux --architecture amd64 --config.workingdir / "$@"
  umoci gc --layout "$layout"
  # The full name beside umoci's tag: ctr names an image by it.
  node -e '
    const fs = require("fs"), f = process.argv[1], idx = JSON.parse(fs.readFileSync(f, "utf8"));
    for (const m of idx.manifests) m.annotations = { ...m.annotations, "io.containerd.image.name": process.argv[2] };
    fs.writeFileSync(f, JSON.stringify(idx));' "$layout/index.json" "$ref"
  tar -C "$layout" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$dest.tmp" .
  mv "$dest.tmp" "$dest"
}

# build NAME REF INPUT-HASH FUNCTION: the archive of FUNCTION's image, unless cached.
build() {
  local name=$1 ref=$2 key
  key=$( (echo "$ref"; echo "$3"; sed -n '/^oci_archive()/,/^}/p' "$0"; declare -f "$4") | sha256sum | cut -c1-16)
  local dest=$out/$name-$key.tar
  if [[ ! -s $dest ]]; then
    log "image $ref"
    "$4" "$dest" "$ref"
  fi
  cache_prune "$dest" "$out" -maxdepth 1 -name "$name-*.tar"
  echo "$dest"
}

pause_image() {
  local root=$work/pause-root
  mkdir -p "$root"
  gcc -static -Os -s -Wall -Wextra -Werror -o "$root/pause" "$here/images/pause.c"
  oci_archive "$1" "$2" "$root" --config.entrypoint /pause --config.user 65535:65535
}
build pause "$CLUSTER_PAUSE_IMAGE" "$(sha256sum "$here/images/pause.c"; gcc --version | head -1)" pause_image

agnhost_image() {
  local root=$work/agnhost-root a
  mkdir -p "$root"/{bin,etc,tmp}
  chmod 1777 "$root/tmp"
  install -m 755 "$bindir/agnhost" "$root/agnhost"
  install -m 755 "$(command -v busybox)" "$root/bin/busybox"
  for a in $(busybox --list); do [[ -e $root/bin/$a ]] || ln -s busybox "$root/bin/$a"; done
  printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  oci_archive "$1" "$2" "$root" --config.entrypoint /agnhost --config.cmd pause \
    --config.env PATH=/bin:/usr/bin
}
build agnhost "$CLUSTER_TEST_IMAGE" "$(sha256sum "$bindir/agnhost" "$(command -v busybox)")" agnhost_image

kube_proxy_image() {
  local root=$work/kube-proxy-root b
  mkdir -p "$root"
  # The machine's apt configuration is not read: the mirror is named here,
  # the archive keys are the machine's debian-archive-keyring.
  mmdebstrap --quiet --variant=extract --include=iptables,conntrack --format=tar \
    --dpkgopt='path-exclude=/usr/share/*' --dpkgopt='path-exclude=/usr/lib/x86_64-linux-gnu/gconv/*' \
    bookworm "$work/kube-proxy-rootfs.tar" "deb ${LBCTL_DEBIAN_MIRROR:-http://deb.debian.org/debian} bookworm main"
  tar -C "$root" -xf "$work/kube-proxy-rootfs.tar" --exclude='./dev/*' --exclude='./usr/share/*' \
    --exclude='./usr/lib/x86_64-linux-gnu/gconv/*'
  for b in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -sf xtables-nft-multi "$root/usr/sbin/$b"
  done
  mkdir -p "$root/usr/local/bin" "$root/run" "$root/tmp"
  chmod 1777 "$root/tmp"
  install -m 755 "$bindir/kube-proxy" "$root/usr/local/bin/kube-proxy"
  oci_archive "$1" "$2" "$root" --config.entrypoint /usr/local/bin/kube-proxy \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
}
build kube-proxy "$CLUSTER_KUBE_PROXY_IMAGE" "$(sha256sum "$bindir/kube-proxy"; echo bookworm iptables conntrack)" kube_proxy_image
cluster_dns_image() {
  local root=$work/cluster-dns-root
  mkdir -p "$root"
  # Debian's node loads some of its own modules from /usr/share/nodejs.
  mmdebstrap --quiet --variant=extract --include=nodejs --format=tar \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/lib/x86_64-linux-gnu/gconv/*' \
    bookworm "$work/cluster-dns-rootfs.tar" "deb ${LBCTL_DEBIAN_MIRROR:-http://deb.debian.org/debian} bookworm main"
  tar -C "$root" -xf "$work/cluster-dns-rootfs.tar" --exclude='./dev/*' --exclude='./usr/share/doc/*' \
    --exclude='./usr/share/man/*' --exclude='./usr/share/locale/*' --exclude='./usr/lib/x86_64-linux-gnu/gconv/*'
  mkdir -p "$root/tmp"
  chmod 1777 "$root/tmp"
  install -m 644 "$here/images/cluster-dns.mjs" "$root/cluster-dns.mjs"
  oci_archive "$1" "$2" "$root" --config.entrypoint /usr/bin/node --config.cmd /cluster-dns.mjs \
    --config.env PATH=/usr/sbin:/usr/bin:/sbin:/bin
}
build cluster-dns "$CLUSTER_DNS_IMAGE" "$(sha256sum "$here/images/cluster-dns.mjs"; echo bookworm nodejs)" cluster_dns_image
[[ $set == e2e ]] || exit 0

# ---------------------------------------------------------------- e2e.test's
# Under the upstream names e2e.test asks for (its --list-images; test/utils/
# image/manifest.go of v1.24), printed instead of the cluster's own; conformance.sh
# imports them. Built from the same inputs, not the upstream images.

# agnhost as upstream builds it (test/images/agnhost/Dockerfile): alpine's
# busybox userland with curl, OpenBSD's nc, iproute2, dig, iperf and bash,
# /agnhost (and the agnhost-2 link the entrypoint tests run), /uploads for
# netexec, porter's localhost.crt and .key. Here: Debian bookworm's packages
# (files only, and their libraries) with dash as /bin/sh and GNU wget (Debian's
# static busybox's wget segfaults on this machine), busybox for every
# other command.
e2e_agnhost_image() {
  local root=$work/e2e-agnhost-root a
  mkdir -p "$root"
  mmdebstrap --quiet --variant=extract --include=dash,bash,curl,wget,netcat-openbsd,iproute2,bind9-dnsutils,iperf --format=tar \
    --dpkgopt='path-exclude=/usr/share/*' --dpkgopt='path-exclude=/usr/lib/x86_64-linux-gnu/gconv/*' \
    bookworm "$work/e2e-agnhost-rootfs.tar" "deb ${LBCTL_DEBIAN_MIRROR:-http://deb.debian.org/debian} bookworm main"
  tar -C "$root" -xf "$work/e2e-agnhost-rootfs.tar" --exclude='./dev/*' --exclude='./usr/share/*' \
    --exclude='./usr/lib/x86_64-linux-gnu/gconv/*'
  # What alternatives would link.
  ln -sf nc.openbsd "$root/bin/nc"
  # dash as /bin/sh, as Debian has it: Debian's static busybox runs its own
  # applets before any on PATH (nc, wget), so it must not be the shell.
  ln -sf dash "$root/bin/sh"
  mkdir -p "$root/usr/local/bin" "$root/tmp" "$root/uploads" "$root/etc" "$root/bin"
  chmod 1777 "$root/tmp"
  install -m 755 "$(command -v busybox)" "$root/usr/local/bin/busybox"
  for a in $(busybox --list); do
    # In /bin, as alpine has them (the tests run /bin/sh): where no package put one.
    [[ -e $root/bin/$a || -e $root/usr/bin/$a || -e $root/sbin/$a || -e $root/usr/sbin/$a || $a == busybox ]] ||
      ln -s /usr/local/bin/busybox "$root/bin/$a"
  done
  ln -sf /usr/bin/iperf "$root/usr/local/bin/iperf"
  install -m 755 "$bindir/agnhost" "$root/agnhost"
  ln -s agnhost "$root/agnhost-2"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=localhost -keyout "$root/localhost.key" -out "$root/localhost.crt" 2>/dev/null
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  oci_archive "$1" "$2" "$root" --config.entrypoint /agnhost --config.cmd pause \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
}
build e2e-agnhost k8s.gcr.io/e2e-test-images/agnhost:2.33 "$(sha256sum "$bindir/agnhost" "$(command -v busybox)"; echo bookworm)" e2e_agnhost_image
# The pause image the tests name (pods that only need to exist).
build e2e-pause k8s.gcr.io/pause:3.6 "$(sha256sum "$here/images/pause.c"; gcc --version | head -1)" pause_image
# busybox:1.29: busybox alone.
e2e_busybox_image() {
  local root=$work/e2e-busybox-root a
  mkdir -p "$root"/{bin,etc,tmp}
  chmod 1777 "$root/tmp"
  install -m 755 "$(command -v busybox)" "$root/bin/busybox"
  for a in $(busybox --list); do [[ -e $root/bin/$a ]] || ln -s busybox "$root/bin/$a"; done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  oci_archive "$1" "$2" "$root" --config.cmd sh --config.env PATH=/bin
}
build e2e-busybox k8s.gcr.io/e2e-test-images/busybox:1.29-2 "$(sha256sum "$(command -v busybox)")" e2e_busybox_image
