#!/usr/bin/env bash
# Prints scripts/vmtest/e2e-seconds from the tap.log of guest runs (several
# LOGDIRs: the largest time of each file wins), for plan.mjs's split.
# Usage: scripts/vmtest/e2e-seconds.sh LOGDIR... > scripts/vmtest/e2e-seconds
set -euo pipefail
sed -n 1,5p "$(dirname "$0")/e2e-seconds"
for d in "$@"; do
  sed -nE 's/^(not )?ok [0-9]+ - (test\/(e2e|native|bpf)\/[^ ]+\.ts)( # exit [0-9]+)? # time=([0-9.]+)ms$/\2 \5/p' "$d/tap.log"
done | awk '{ s = int($2 / 1000 + 0.5); if (s > max[$1]) max[$1] = s } END { for (f in max) printf "%-29s %d\n", f, max[f] }' | sort -k2,2nr
