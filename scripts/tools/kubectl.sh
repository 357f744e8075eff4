#!/usr/bin/env bash
# Prints the path of a kubectl whose built-in kustomize is v5 (the deploy/
# tests render the manifests with `kubectl kustomize`). The machine's own
# kubectl is used when it is recent enough; otherwise Debian trixie's
# kubectl package (bookworm's kubernetes-client is 1.20, whose kustomize
# predates the fields deploy/ uses) is downloaded through an apt of its own
# under ~/.cache/lbctl/tools (signed by Debian's archive keyring; the
# machine's apt configuration is never read or written) and unpacked there.
set -euo pipefail
cache=${LBCTL_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lbctl/tools}

kustomize_major() { "$1" version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\([0-9]*\).*/\1/p'; }

if [[ ${LBCTL_KUBECTL_OWN:-1} == 1 ]] && own=$(command -v kubectl 2>/dev/null) && [[ $(kustomize_major "$own") -ge 5 ]]; then
  echo "$own"
  exit 0
fi
bin=$cache/kubectl/usr/bin/kubectl
if [[ -x $bin && $(kustomize_major "$bin") -ge 5 ]]; then
  echo "$bin"
  exit 0
fi
suite=trixie dir=$cache/apt/$suite
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
mirror=${LBCTL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$dir"/{lists/partial,archives/partial} "$cache/debs"
echo "deb [arch=amd64 signed-by=$keyring] $mirror $suite main" >"$dir/sources.list"
opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir" -o "Dir::Cache::archives=$dir/archives"
  -o Dir::State::Status=/dev/null -o APT::Architecture=amd64 -o Debug::NoLocking=1
  -o APT::Sandbox::User=root -o Acquire::Languages=none)
echo "kubectl: fetching Debian $suite's kubectl into $cache" >&2
apt-get "${opts[@]}" update -qq >&2
rm -f "$cache"/debs/kubectl_*.deb
# apt-get download checks the package against the signed Release file's hashes.
(cd "$cache/debs" && apt-get "${opts[@]}" download -qq kubectl) >&2
rm -rf "$cache/kubectl"
dpkg-deb -x "$(ls "$cache"/debs/kubectl_*.deb | head -1)" "$cache/kubectl"
[[ $(kustomize_major "$bin") -ge 5 ]] || { echo "kubectl: $bin does not run here or has no kustomize v5" >&2; exit 1; }
echo "$bin"
