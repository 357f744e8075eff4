#!/usr/bin/env bash
# `make image`: the container image of the Dockerfile, built without a
# container engine or registry, from Debian packages only:
#
#   layer 1  Debian trixie minbase + the runtime packages the Dockerfile's
#            last stage pins (mmdebstrap; cached by the pins, see below)
#   layer 2  /opt/lbctl: the FILEs, from this checkout's build (make bpf
#            native ts), and the node binary of scripts/node.env's prefix
#            (scripts/bootstrap.sh installed it), i.e. what the Dockerfile
#            COPYs from its build stage
#
# packed with umoci into an OCI image layout and tarred: OUT (an
# oci-archive, for `podman load -i`, `skopeo copy oci-archive:OUT:VERSION`
# and `ctr images import`; docs/image.md).
#
# The objects, addon and bundle come from this host (Debian bookworm: libbpf
# 1.1 headers) and run on trixie's libbpf 1.5: the addon links libbpf.so.1,
# which both provide, and uses no libbpf API newer than 1.1. Node.js is the
# same build on both (scripts/node.env). test/deploy/image.ts runs the
# image's `lbctl version` and `lbctl agent` to prove the addon loads and
# works there.
#
# Usage: build.sh OUT.oci.tar FILE...   (as root; FILEs relative to the checkout)
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${1:?usage: build.sh OUT.oci.tar FILE...}
version=$(node -p "require('./package.json').version")
suite=trixie
mirror="deb http://deb.debian.org/debian $suite main"
cache=${LBCTL_IMAGE_CACHE:-$HOME/.cache/lbctl/image}
log() { echo "image: $*" >&2; }

# What lands in /opt/lbctl: FILE... (the Makefile's IMAGE_FILES, where
# they are explained), paths relative to the checkout.
FILES=("${@:2}")
((${#FILES[@]})) || { echo "usage: build.sh OUT.oci.tar FILE..." >&2; exit 1; }

# The runtime packages, name=version, from the Dockerfile's last stage: the
# one list both builds install, so a version bump is one edit.
mapfile -t packages < <(awk -v last="$(grep -c '^FROM ' Dockerfile)" '/^FROM /{n++} n==last' Dockerfile |
  sed -e :a -e '/\\$/N; s/\\\n//; ta' | grep -E '^RUN .*apt-get( -[^ ]+)* install' |
  grep -oE '(^|[[:space:]])[a-z0-9][a-z0-9.+-]*=[0-9][^[:space:]]*' | sed 's/^[[:space:]]*//' | sort -u)
((${#packages[@]})) || { log "no name=version packages found in the Dockerfile's last stage"; exit 1; }

# root mode: the rootfs's files get their real owners without a user
# namespace (mmdebstrap's unshare mode needs subuids this machine may lack).
[[ $(id -u) -eq 0 ]] || { log "needs root (mmdebstrap --mode=root)"; exit 1; }
for f in "${FILES[@]}"; do
  [[ -f $f ]] || { log "$f is missing: run make build first"; exit 1; }
done

mkdir -p "$cache/debs" "$(dirname "$out")"
work=$(mktemp -d "${TMPDIR:-/tmp}/lbctl-image.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Layer 1, cached by everything that decides its contents: a second
# `make image` (a code change) reuses it and touches no network. The .debs
# are cached too (sync-in/sync-out, mmdebstrap(1)), so a pin bump downloads
# only what changed.
dpkgopts=(
  # What debian:trixie-slim leaves out (its /etc/dpkg/dpkg.cfg.d/docker):
  # documentation, man pages, locales; copyright files stay.
  'path-exclude=/usr/share/doc/*'
  'path-include=/usr/share/doc/*/copyright'
  'path-exclude=/usr/share/man/*'
  'path-exclude=/usr/share/info/*'
  'path-exclude=/usr/share/groff/*'
  'path-exclude=/usr/share/lintian/*'
  'path-exclude=/usr/share/locale/*'
)
key=$( (printf '%s\n' "$suite" "$mirror" "${packages[@]}" "${dpkgopts[@]}"; sed -n '/^# layer1:begin/,/^# layer1:end/p' "$0") |
  sha256sum | cut -c1-16)
base=$cache/base-$key.tar
if [[ ! -s $base ]]; then
  log "layer 1: Debian $suite minbase + ${packages[*]} (mmdebstrap; .debs cached in $cache/debs)"
  args=()
  for o in "${dpkgopts[@]}"; do args+=(--dpkgopt="$o"); done
  # layer1:begin
  # --skip=essential/unlink keeps the downloaded .debs for sync-out.
  # resolv.conf and hostname are the host's: the runtime provides its own.
  # Trixie's keys come from this machine's debian-archive-keyring; the
  # machine's own apt sources are never touched.
  SOURCE_DATE_EPOCH=0 mmdebstrap --quiet --variant=minbase --mode=root --format=tar \
    --include="$(IFS=,; echo "${packages[*]}")" \
    "${args[@]}" \
    --skip=essential/unlink \
    --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
    --setup-hook="sync-in $cache/debs /var/cache/apt/archives/" \
    --customize-hook="sync-out /var/cache/apt/archives $cache/debs" \
    --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb "$1"/etc/resolv.conf "$1"/etc/hostname' \
    "$suite" "$work/base-dev.tar" "$mirror"
  # The runtime mounts /dev; device nodes have no place in a layer.
  mmtarfilter --path-exclude='/dev/*' <"$work/base-dev.tar" >"$work/base.tar"
  # layer1:end
  mv "$work/base.tar" "$base"
  # Older base layers of other pins are dead weight.
  find "$cache" -maxdepth 1 -name 'base-*.tar' ! -name "base-$key.tar" -delete
fi

# shellcheck source=scripts/node.env
. scripts/node.env
[[ -x $LBCTL_NODE_PREFIX/bin/node ]] || { log "$LBCTL_NODE_PREFIX/bin/node is missing: run scripts/bootstrap.sh"; exit 1; }
log "layer 2: /opt/lbctl (${#FILES[@]} files from this checkout, node $("$LBCTL_NODE_PREFIX/bin/node" --version) from $LBCTL_NODE_PREFIX)"
mkdir -p "$work/app/opt/lbctl" "$work/app/usr/local/bin"
for f in "${FILES[@]}"; do
  install -D -m "$(stat -c %a "$f")" "$f" "$work/app/opt/lbctl/$f"
done
install -D -m 755 "$LBCTL_NODE_PREFIX/bin/node" "$work/app/opt/lbctl/node/bin/node"
install -D -m 644 "$LBCTL_NODE_PREFIX/LICENSE" "$work/app/opt/lbctl/node/LICENSE"
ln -s /opt/lbctl/bin/lbctl "$work/app/usr/local/bin/lbctl"
ln -s /opt/lbctl/node/bin/node "$work/app/usr/local/bin/node"
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
tar -C "$work/app" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -cf "$work/app.tar" .

# The image: both layers and the config the Dockerfile's ENTRYPOINT, CMD,
# ENV, STOPSIGNAL and LABELs give (keep the two in step).
layout=$work/oci
umoci init --layout "$layout"
umoci new --image "$layout:$version"
created=$(date -u -d "@$epoch" +%FT%TZ)
umoci raw add-layer --image "$layout:$version" --history.created "$created" \
  --history.created_by "mmdebstrap --variant=minbase $suite + ${packages[*]}" "$base"
umoci raw add-layer --image "$layout:$version" --history.created "$created" \
  --history.created_by "COPY /opt/lbctl (${FILES[*]} node/bin/node node/LICENSE)" "$work/app.tar"
umoci config --image "$layout:$version" --created "$created" --author lbctl \
  --history.created "$created" --history.created_by "the Dockerfile's ENTRYPOINT, CMD, ENV, STOPSIGNAL and LABELs" \
  --os linux --architecture amd64 \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env MALLOC_ARENA_MAX=1 \
  --config.env MALLOC_MMAP_THRESHOLD_=65536 \
  --config.env MALLOC_TRIM_THRESHOLD_=1048576 \
  --config.entrypoint /usr/bin/tini-static --config.entrypoint -- --config.entrypoint /opt/lbctl/bin/lbctl \
  --config.cmd agent \
  --config.workingdir / \
  --config.stopsignal SIGTERM \
  --config.label org.opencontainers.image.title=lbctl \
  --config.label "org.opencontainers.image.version=$version" \
  --config.label org.opencontainers.image.licenses=Apache-2.0 \
  --config.label "org.opencontainers.image.description=eBPF service load balancer: a kube-proxy replacement"
umoci gc --layout "$layout"

tar -C "$layout" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -cf "$out.tmp" .
mv "$out.tmp" "$out"
log "$out: $(du -h "$out" | cut -f1), tag $version"
