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
for tool in umoci gcc busybox mmdebstrap; do
  command -v "$tool" >/dev/null || die "$tool is missing (scripts/bootstrap.sh --cluster installs it)"
done
# busybox-static's: the image has no libc for a dynamic one.
! ldd "$(command -v busybox)" >/dev/null 2>&1 || die "$(command -v busybox) is not static (Debian's busybox-static is)"
bindir=$("$here/binaries.sh" agnhost kube-proxy)
out=$CLUSTER_CACHE/images
mkdir -p "$out"
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
    find "$out" -maxdepth 1 -name "$name-*.tar" ! -path "$dest" -delete
  fi
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
