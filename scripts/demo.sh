#!/usr/bin/env bash
# lbctl demo: builds a throwaway sandbox, runs the agent on examples/, drives
# real clients (curl, dig) through the services, shows the maps and counters,
# and removes everything again, whatever happens.
#
#   child cgroup  <cgroup2>/lbctl-demo-<pid>   the agent attaches here; only the demo's clients join it
#   bpf root      /sys/fs/bpf/lbctl-demo-<pid>
#   client netns  lbctl-demo-<pid>-c  10.244.0.1/16  fd00:244::1/64 (no default route)
#   backend netns lbctl-demo-<pid>-b  web-N: 10.244.1.N, fd00:244::1:N (:8080)  dns-N: 10.244.2.N (:53)
#
# Needs root, `make build`, and: bash, ip, curl, dig, dnsmasq, python3, node.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LBCTL="$ROOT/bin/lbctl"
RUN="lbctl-demo-$$"
RUN_DIR="/tmp/$RUN"
BPF_ROOT="/sys/fs/bpf/$RUN"
CLIENT_NS="$RUN-c"
BACKEND_NS="$RUN-b"
CGROUP=""          # set once the cgroup v2 mount is known
AGENT_PID=""

WEB_VIP=10.96.0.10
WEB_VIP6=fd00:96::10
DNS_VIP=10.96.0.53
WEB_BACKENDS=(10.244.1.1 10.244.1.2 10.244.1.3)
WEB_BACKENDS6=(fd00:244::1:1 fd00:244::1:2 fd00:244::1:3)
DNS_BACKENDS=(10.244.2.1 10.244.2.2)
REQUESTS=30

section() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
note() { printf '   %s\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

# ------------------------------------------------------------- teardown

teardown() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  section "teardown"
  if [[ -n $AGENT_PID ]] && kill -0 "$AGENT_PID" 2>/dev/null; then
    kill -TERM "$AGENT_PID"
    for _ in $(seq 1 50); do kill -0 "$AGENT_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$AGENT_PID" 2>/dev/null
    wait "$AGENT_PID" 2>/dev/null
  fi
  [[ -d $BPF_ROOT ]] && "$LBCTL" cleanup --bpf-root "$BPF_ROOT" | sed 's/^/   /'
  # Every server and the agent were recorded in $RUN_DIR/pids as they started.
  if [[ -f $RUN_DIR/pids ]]; then
    while read -r pid; do kill -KILL "$pid" 2>/dev/null; done <"$RUN_DIR/pids"
  fi
  if [[ -n $CGROUP && -d $CGROUP ]]; then
    for _ in $(seq 1 20); do
      while read -r pid; do kill -KILL "$pid" 2>/dev/null; done <"$CGROUP/cgroup.procs"
      rmdir "$CGROUP" 2>/dev/null && break
      sleep 0.1
    done
  fi
  for ns in "$CLIENT_NS" "$BACKEND_NS"; do
    [[ -e /run/netns/$ns ]] && ip netns del "$ns"
    rm -rf "/etc/netns/$ns"
  done
  rm -rf "$RUN_DIR"
  note "removed the agent, servers, datapath, network namespaces and cgroup"
  if [[ $rc -eq 0 ]]; then printf '\ndemo: OK\n'; else printf '\ndemo: FAILED (exit %s)\n' "$rc" >&2; fi
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------- helpers

record_pid() { echo "$1" >>"$RUN_DIR/pids"; }

# A client: joins the demo cgroup, then enters the client netns (in that
# order: `ip netns exec` remounts /sys, which hides cgroupfs).
client() {
  bash -c 'echo $$ > "$1/cgroup.procs" && ns=$2 && shift 2 && exec ip netns exec "$ns" "$@"' client "$CGROUP" "$CLIENT_NS" "$@"
}

# waits up to $1 tenths of a second for the command after it to succeed
retry() {
  local n=$1; shift
  for _ in $(seq 1 "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

# ------------------------------------------------------------- preflight

section "preflight"
[[ $(id -u) -eq 0 ]] || die "must run as root (BPF, netns, cgroups)"
[[ -x $LBCTL && -f $ROOT/bpf/.output/sock.bpf.o && -f $ROOT/dist/bundle/lbctl.js ]] || die "lbctl is not built: run 'make build'"
for tool in ip curl dig dnsmasq python3 node; do command -v "$tool" >/dev/null || die "$tool is missing"; done
CGROUP_MOUNT=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
[[ -n $CGROUP_MOUNT ]] || die "no cgroup v2 mount in /proc/mounts"
CGROUP="$CGROUP_MOUNT/$RUN"
if ! awk '$2 == "/sys/fs/bpf" && $3 == "bpf" { found = 1 } END { exit !found }' /proc/mounts; then
  mount -t bpf bpf /sys/fs/bpf
fi
# Leftovers of demo or test runs that died without tearing down (owner gone).
bash "$ROOT/scripts/sandbox-cleanup.sh" | grep -v '^removed 0 ' | sed 's/^/   /' || true
# lbctl version --client: its first line (the rest: the Node.js, V8, kernel, commit and build ids).
note "$("$LBCTL" version --client | sed -n 1p)"
note "run id $RUN; cgroup $CGROUP; bpf root $BPF_ROOT"

# ------------------------------------------------------------- sandbox

section "sandbox: client and backend network namespaces, child cgroup"
mkdir -p "$RUN_DIR/www"
: >"$RUN_DIR/pids"
mkdir "$CGROUP"
ip netns add "$CLIENT_NS"
ip netns add "$BACKEND_NS"
ip link add lbc0 netns "$CLIENT_NS" type veth peer name lbb0 netns "$BACKEND_NS"
ip -n "$CLIENT_NS" addr add 10.244.0.1/16 dev lbc0
ip -n "$CLIENT_NS" addr add fd00:244::1/64 dev lbc0 nodad
for a in "${WEB_BACKENDS[@]}" "${DNS_BACKENDS[@]}"; do ip -n "$BACKEND_NS" addr add "$a/16" dev lbb0; done
for a in "${WEB_BACKENDS6[@]}"; do ip -n "$BACKEND_NS" addr add "$a/64" dev lbb0 nodad; done
for ns in "$CLIENT_NS" "$BACKEND_NS"; do ip -n "$ns" link set lo up; done
ip -n "$CLIENT_NS" link set lbc0 up
ip -n "$BACKEND_NS" link set lbb0 up
# Clients resolve names through the DNS service (ip netns exec bind-mounts this file).
mkdir -p "/etc/netns/$CLIENT_NS"
echo "nameserver $DNS_VIP" >"/etc/netns/$CLIENT_NS/resolv.conf"
note "client  $CLIENT_NS: 10.244.0.1, fd00:244::1 (no default route: service addresses are routed nowhere)"
note "backend $BACKEND_NS: web ${WEB_BACKENDS[*]} ${WEB_BACKENDS6[*]}; dns ${DNS_BACKENDS[*]}"

section "backends: 3 web servers (IPv4 + IPv6), 2 dnsmasq"
for i in 0 1 2; do
  for addr in "${WEB_BACKENDS[$i]}" "${WEB_BACKENDS6[$i]}"; do
    dir="$RUN_DIR/www/$addr"
    mkdir -p "$dir"
    printf 'web-%s %s' "$((i + 1))" "$addr" >"$dir/index.html"
    ip netns exec "$BACKEND_NS" python3 -m http.server --bind "$addr" --directory "$dir" 8080 \
      </dev/null >/dev/null 2>>"$RUN_DIR/http.log" &
    record_pid $!
    disown
  done
done
for i in 0 1; do
  addr=${DNS_BACKENDS[$i]}
  ip netns exec "$BACKEND_NS" dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts \
    --bind-interfaces --listen-address="$addr" --port=53 --user=root --group=root \
    --pid-file="$RUN_DIR/dnsmasq-$i.pid" \
    --address=/web.default.svc.cluster.local/$WEB_VIP --address=/web.default.svc.cluster.local/$WEB_VIP6 \
    --address=/whoami.demo/"$addr" </dev/null >/dev/null 2>>"$RUN_DIR/dnsmasq.log" &
  record_pid $!
  disown
done
for i in 0 1 2; do
  for url in "http://${WEB_BACKENDS[$i]}:8080/" "http://[${WEB_BACKENDS6[$i]}]:8080/"; do
    retry 100 ip netns exec "$BACKEND_NS" curl -gsf --max-time 1 "$url" || die "web backend $url did not come up"
  done
done
for addr in "${DNS_BACKENDS[@]}"; do
  retry 100 ip netns exec "$BACKEND_NS" dig "@$addr" whoami.demo +short +time=1 +tries=1 || die "dnsmasq on $addr did not come up"
done
note "all backends answer (checked from inside the backend netns)"

# ------------------------------------------------------------- agent

section "agent: lbctl agent --source file:examples"
"$LBCTL" agent --source "file:$ROOT/examples" --cgroup "$CGROUP" --bpf-root "$BPF_ROOT" \
  --health-port 0 --health-bind-address 127.0.0.1 --metrics-port 0 --api-socket "$RUN_DIR/agent.sock" --no-nodeport --health-mesh-port 0 2>"$RUN_DIR/agent.log" &
AGENT_PID=$!
record_pid "$AGENT_PID"
for _ in $(seq 1 300); do
  grep -q '"msg":"sync done"' "$RUN_DIR/agent.log" && break
  kill -0 "$AGENT_PID" 2>/dev/null || { cat "$RUN_DIR/agent.log" >&2; die "the agent exited"; }
  sleep 0.1
done
grep -q '"msg":"sync done"' "$RUN_DIR/agent.log" || { cat "$RUN_DIR/agent.log" >&2; die "no sync within 30 s"; }
grep '"msg":"sync done"' "$RUN_DIR/agent.log" | head -1 | node -e '
  const r = JSON.parse(require("fs").readFileSync(0, "utf8"));
  console.log(`   first sync: ${r.frontends} frontends, ${r.applied} map writes in ${r.durationMs} ms`);'
if grep -q '"msg":"bad input skipped"' "$RUN_DIR/agent.log"; then
  grep '"msg":"bad input skipped"' "$RUN_DIR/agent.log" >&2
  die "examples/ has bad input"
fi

# ------------------------------------------------------------- clients

section "HTTP: $REQUESTS x curl http://$WEB_VIP/ from the client netns"
declare -A hits=()
for n in $(seq 1 "$REQUESTS"); do
  out=$(client curl -sS --max-time 5 -w '|%{remote_ip}:%{remote_port}' "http://$WEB_VIP/") || die "curl request $n failed"
  body=${out%%|*}
  peer=${out##*|}
  [[ $peer == "$WEB_VIP:80" ]] || die "curl saw peer $peer, not the service $WEB_VIP:80"
  hits[$body]=$(( ${hits[$body]:-0} + 1 ))
done
for b in "${!hits[@]}"; do
  bar=$(printf '%*s' "${hits[$b]}" '' | tr ' ' '#')
  printf '   %-22s %3d  %s\n' "$b" "${hits[$b]}" "$bar"
done | sort
(( ${#hits[@]} == ${#WEB_BACKENDS[@]} )) || note "(only ${#hits[@]} of ${#WEB_BACKENDS[@]} backends were picked this time)"
note "curl's remote address was $WEB_VIP:80 every time: the backend stays invisible to the client"

section "HTTP over IPv6: curl -g http://[$WEB_VIP6]/"
for n in 1 2 3 4 5 6; do
  out=$(client curl -gsS --max-time 5 -w '|%{remote_ip}' "http://[$WEB_VIP6]/") || die "curl over IPv6 failed"
  note "${out%%|*}    (peer ${out##*|})"
done

section "DNS: dig @$DNS_VIP (UDP and TCP)"
for n in 1 2 3 4 5 6; do
  who=$(client dig "@$DNS_VIP" whoami.demo +short +time=2 +tries=1) || die "dig failed"
  [[ -n $who ]] || die "dig got no answer"
  note "dig query $n (UDP) answered by dnsmasq on $who"
done
who=$(client dig "@$DNS_VIP" +tcp whoami.demo +short +time=2 +tries=1) || die "dig +tcp failed"
[[ -n $who ]] || die "dig +tcp got no answer"
note "dig +tcp query answered by dnsmasq on $who"
# dig connect()s its UDP socket; this query uses an unconnected one, so its
# reply's source is what recvmsg's reverse translation made of it.
PY_QUERY='import socket, struct, sys
name, server = sys.argv[1], sys.argv[2]
q = struct.pack("!6H", 0x4242, 0x100, 1, 0, 0, 0) + b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack("!HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.sendto(q, (server, 53))
r, src = s.recvfrom(512)
print(socket.inet_ntoa(r[-4:]), "%s:%d" % src)'
for n in 1 2 3; do
  read -r who src < <(client python3 -c "$PY_QUERY" whoami.demo "$DNS_VIP") || die "unconnected DNS query failed"
  [[ $src == "$DNS_VIP:53" ]] || die "the reply came from $src, not the service $DNS_VIP:53"
  note "sendto/recvfrom query $n answered by dnsmasq on $who; recvfrom() says the reply came from $src"
done

section "by name: curl http://web.default.svc.cluster.local/ (resolved through the DNS service)"
for n in 1 2 3; do
  out=$(client curl -sS --max-time 5 -w '|%{remote_ip}' http://web.default.svc.cluster.local/) || die "curl by name failed"
  note "${out%%|*}    (peer ${out##*|})"
done

section "refused at once: a port the service does not serve"
set +e
err=$(client curl -sS --max-time 5 -w '%{time_total}' -o /dev/null "http://$WEB_VIP:81/" 2>&1)
rc=$?
set -e
[[ $rc -eq 7 ]] || die "expected curl exit 7 (connection refused), got $rc: $err"
note "curl exit $rc: ${err//$'\n'/ }"

section "lbctl bpf lb list"
"$LBCTL" bpf lb list --bpf-root "$BPF_ROOT" | sed 's/^/   /'

section "lbctl bpf metrics list"
"$LBCTL" bpf metrics list --bpf-root "$BPF_ROOT" | sed 's/^/   /'
