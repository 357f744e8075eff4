#!/usr/bin/env bash
# The cluster's memory, per cgroup (control-plane, each node with its pods)
# and in total: the processes' RSS summed (VmRSS; shared pages counted once
# per process), and where the memory controller is, the cgroup's own count
# (rss + cache: RSS plus the page cache it charged, e.g. etcd's data and the
# images' files). Prints a table, or JSON with --json.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
v2=$(cgroup_v2_mount)
memcg=$(awk '$3 == "cgroup" && $4 ~ /(^|,)memory(,|$)/ { print $2; exit }' /proc/mounts)
json=0
[[ ${1:-} != --json ]] || json=1
[[ -d $v2/$CLUSTER_NAME ]] || die "no cluster is up"

rows=()
total_rss=0 total_procs=0 total_cg=0
for g in control-plane "${CLUSTER_NODES[@]}"; do
  rss=0 procs=0
  # shellcheck disable=SC2044 # the files' contents, PIDs, not file names
  for pid in $(find "$v2/$CLUSTER_NAME/$g" -name cgroup.procs -exec cat {} + 2>/dev/null); do
    kb=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null) || continue
    rss=$((rss + ${kb:-0})) procs=$((procs + 1))
  done
  cg=0
  if [[ -n $memcg && -r $memcg/$CLUSTER_NAME/$g/memory.stat ]]; then
    cg=$(awk '$1 == "total_rss" || $1 == "total_cache" { s += $2 } END { print int(s / 1024) }' "$memcg/$CLUSTER_NAME/$g/memory.stat")
  fi
  rows+=("$g $procs $((rss / 1024)) $((cg / 1024))")
  total_rss=$((total_rss + rss)) total_procs=$((total_procs + procs)) total_cg=$((total_cg + cg))
done
rows+=("total $total_procs $((total_rss / 1024)) $((total_cg / 1024))")

if ((json)); then
  printf '{'
  sep=
  for r in "${rows[@]}"; do
    read -r g p r c <<<"$r"
    printf '%s"%s":{"processes":%d,"rssMiB":%d,"cgroupMiB":%d}' "$sep" "$g" "$p" "$r" "$c"
    sep=,
  done
  echo '}'
else
  printf '%-14s %9s %8s %11s\n' group processes 'RSS MiB' 'cgroup MiB'
  for r in "${rows[@]}"; do printf '%-14s %9s %8s %11s\n' $r; done
fi
