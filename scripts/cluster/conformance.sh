#!/usr/bin/env bash
# Kubernetes' own e2e tests (e2e.test of CLUSTER_K8S_DIR, built providerless)
# against the running cluster, with whichever proxy it runs (lbctl.sh or
# kube-proxy.sh first): the images the tests ask for are built (images.sh
# e2e) and imported into every node under their upstream names, then
# e2e.test runs in the control plane's namespace and cgroup (cluster-down
# ends it if it is left) with the admin kubeconfig, and writes its JUnit
# report and its log to DIR. Exits with e2e.test's status.
#
# Usage: conformance.sh [--focus REGEX] [--skip REGEX] [--report DIR] [--dry-run] [--no-import]
#   default focus: the 18 '[sig-network] Services ... [Conformance]' specs
#   default report: $CLUSTER_STATE/conformance (cluster-down keeps the
#   logs only: pass --report to keep the report)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
focus='\[sig-network\] Services .*\[Conformance\]'
skip=
report=$CLUSTER_STATE/conformance
dry=()
noimport=
while (($#)); do
  case $1 in
    --focus) focus=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --dry-run) dry=(--ginkgo.dryRun); shift ;;
    --no-import) noimport=1; shift ;;
    *) die "conformance.sh: unknown argument $1" ;;
  esac
done
[[ -e /run/netns/$CLUSTER_CP_NETNS ]] || die "no cluster is up: make cluster-up"
bin=$("$here/binaries.sh" e2e.test)
mkdir -p "$report"
report=$(realpath "$report")
if ((${#dry[@]} == 0)) && [[ -z $noimport ]]; then
  mapfile -t archives < <("$here/images.sh" e2e | tail -n 3)
  "$here/import.sh" "${archives[@]}"
  log "imported e2e.test's images: $(for a in "${archives[@]}"; do basename "$a"; done | tr '\n' ' ')"
fi
log "e2e.test --ginkgo.focus='$focus'${skip:+ --ginkgo.skip='$skip'} (report in $report)"
# e2e.test writes files (its kubectl's cache) in its working directory.
cd "$report"
set +e
"$here/enter.sh" control-plane "$CLUSTER_CP_NETNS" "$bin/e2e.test" \
  --kubeconfig="$CLUSTER_STATE/admin.kubeconfig" --provider=skeleton --num-nodes="${#CLUSTER_NODES[@]}" \
  --report-dir="$report" --dump-logs-on-failure=false --ginkgo.noColor \
  --ginkgo.focus="$focus" ${skip:+--ginkgo.skip="$skip"} "${dry[@]}" >"$report/e2e.log" 2>&1
rc=$?
set -e
grep -E '^(Ran |PASS|FAIL|SUCCESS|--- FAIL)' "$report/e2e.log" >&2 || true
exit "$rc"
