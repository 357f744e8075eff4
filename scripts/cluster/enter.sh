#!/usr/bin/env bash
# Runs CMD in the cluster's cgroup GROUP (under every hierarchy: the cgroup
# v1 controllers and cgroup2) and in network namespace NETNS, by exec, so
# CMD keeps this process's PID (up.sh records it) and its children inherit
# both.
#
# Usage: enter.sh GROUP NETNS CMD...
set -euo pipefail
source "$(dirname "$0")/lib.sh"
group=$1 netns=$2
shift 2
for m in $(cgroup_v1_mounts) $(cgroup_v2_mount); do
  echo $$ >"$m/$CLUSTER_NAME/$group/cgroup.procs"
done
exec nsenter --net="/run/netns/$netns" -- "$@"
