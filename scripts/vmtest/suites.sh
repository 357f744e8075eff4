#!/usr/bin/env bash
# Runs lbctl's kernel-facing suites against the running kernel, in a guest
# (scripts/vmtest/init) or on the host. Writes to OUT:
#   verifier.log   every object through the verifier (and which fallbacks ran)
#   tap.log        native, BPF_PROG_TEST_RUN, datapath and e2e suites (node-tap files, TAP)
#   summary        "passed failed" counts, one line
# Usage: suites.sh REPO OUT
set -uo pipefail
repo=$1 out=$2
cd "$repo" || exit 1
mkdir -p "$out"
# The host's Node.js (scripts/node.env), which a guest sees over 9p: its
# prefix is under /opt, not under the guest's own /tmp.
# shellcheck source=scripts/node.env
. scripts/node.env
export PATH=$LBCTL_NODE_PREFIX/bin:$PATH

echo "kernel: $(uname -r) ($(uname -v))"
echo "node: $(node --version 2>&1) ($(command -v node))"
# A fresh guest's loopback is down: the API server fake, health and metrics servers need it.
ip link set lo up

# Module autoload works (the e2e suites need veth, clsact, cls_bpf).
probe=lbctl-vmt$$
if ip link add "${probe}a" type veth peer name "${probe}b" 2>"$out/modules.log"; then
  ip link del "${probe}a"
  echo "modules: veth ok"
else
  echo "modules: veth FAILED: $(cat "$out/modules.log") (modprobe: $(cat /proc/sys/kernel/modprobe))"
fi
node scripts/vmtest/verify-objects.mjs >"$out/verifier.log" 2>&1
cat "$out/verifier.log"
v_pass=$(sed -n 's/^verifier: \([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$out/verifier.log")
v_fail=$(sed -n 's/^verifier: \([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$out/verifier.log")
: "${v_pass:=0}" "${v_fail:=1}"

# Which suites: OUT/suites, one tap path per line, written by vmtest.sh
# from the matrix (scripts/vmtest/plan.mjs). The suites were type-checked
# on the host; only transpile here.
suites=$(tr '\n' ' ' <"$out/suites" 2>/dev/null)
[[ -n ${suites// /} ]] || suites="test/native test/bpf"
# Facts for docs/kernels.md (scripts/vmtest/kernels-doc.mjs): what the verifier and the probe found.
grep -E '^(kernel|features|feature|fallbacks|udp-termination|verifier: (ok|fallback|FAIL))' "$out/verifier.log" >"$out/facts" 2>/dev/null
echo "kernel: $(uname -r)" >>"$out/facts"
tap_timeout=${LBCTL_VMTEST_TAP_TIMEOUT:-5400}
# Each file runs as its own node, from its bundle (vmtest.sh made them), not
# under tap's runner, whose coverage hook costs ~10 s a node start under TCG
# (scripts/vmtest/tap-files.mjs).
LBCTL_KERNEL_FACTS=$out/facts timeout "$tap_timeout" \
  node scripts/vmtest/tap-files.mjs --timeout 1200 --bundles dist/vmtest-bundles $suites >"$out/tap.log" 2>&1
tap_rc=$?
summary=$(grep -E '^# \{ total: [0-9]+' "$out/tap.log" | tail -1)
total=$(sed -n 's/.*total: \([0-9]*\).*/\1/p' <<<"$summary")
pass=$(sed -n 's/.*pass: \([0-9]*\).*/\1/p' <<<"$summary")
if [[ -z $total ]]; then
  if ((tap_rc == 124)); then
    # The files that finished are in tap.log; the one still running is the last "# Subtest: test/..." there.
    echo "tap: timed out after ${tap_timeout}s in $(sed -n 's/^# Subtest: \(test\/.*\)$/\1/p' "$out/tap.log" | tail -1)," \
      "$(grep -cE '^ok [0-9]+ - test/' "$out/tap.log") files passed before; see tap.log"
  else
    echo "tap: no summary (rc $tap_rc); see tap.log"
  fi
  total=1 pass=0
fi
grep -E '^not ok' "$out/tap.log" | sed 's/^/tap: /'
echo "tap: rc $tap_rc, $pass of $total passed"
echo "$((v_pass + pass)) $((v_fail + total - pass))" >"$out/summary"
