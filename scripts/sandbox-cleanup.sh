#!/usr/bin/env bash
# Removes what crashed e2e test runs (lbctl-test-<pid>-…) and demo runs
# (lbctl-demo-<pid>) left behind: their processes, pinned datapath, network
# namespaces, cgroups and temp dirs. A run whose owning process (the <pid> in
# its name) is still alive is left alone; --all removes those too.
#
# Only processes the run recorded (in /tmp/<run>/pids, checked against their
# command line) or that sit in the run's own cgroup are killed, each by pid.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LBCTL="$ROOT/bin/lbctl"
ALL=0
[[ ${1:-} == --all ]] && ALL=1

CGROUP_MOUNT=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)

# names of leftover runs, from every place a run leaves something
runs() {
  {
    ls /tmp /sys/fs/bpf /run/netns ${CGROUP_MOUNT:+"$CGROUP_MOUNT"} 2>/dev/null
  } | sed -nE 's/^(lbctl-(test|demo)-[0-9]+(-[0-9a-f]{6})?)(-[cb])?$/\1/p' | sort -u
}

owner_alive() {
  local pid
  pid=$(sed -nE 's/^lbctl-(test|demo)-([0-9]+).*/\2/p' <<<"$1")
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

removed=0
for run in $(runs); do
  if [[ $ALL -eq 0 ]] && owner_alive "$run"; then
    echo "skipping $run: its owner is still running"
    continue
  fi
  echo "removing $run"
  if [[ -f /tmp/$run/pids ]]; then
    while read -r pid; do
      [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$run" && kill -KILL "$pid" 2>/dev/null || true
    done <"/tmp/$run/pids"
  fi
  if [[ -d /sys/fs/bpf/$run ]]; then
    "$LBCTL" cleanup --bpf-root "/sys/fs/bpf/$run" || echo "  lbctl cleanup failed for /sys/fs/bpf/$run" >&2
  fi
  for ns in "$run-c" "$run-b"; do
    [[ -e /run/netns/$ns ]] && ip netns del "$ns"
    rm -rf "/etc/netns/$ns"
  done
  cg="$CGROUP_MOUNT/$run"
  if [[ -n $CGROUP_MOUNT && -d $cg ]]; then
    for _ in $(seq 1 20); do
      while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$cg/cgroup.procs"
      rmdir "$cg" 2>/dev/null && break
      sleep 0.1
    done
    [[ -d $cg ]] && echo "  could not remove cgroup $cg" >&2
  fi
  rm -rf "/tmp/$run"
  removed=$((removed + 1))
done
echo "removed $removed leftover run(s)"
