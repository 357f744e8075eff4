#!/usr/bin/env bash
# make vmtest (and make test's guests): lbctl's kernel-facing suites on every
# kernel of the matrix (scripts/vmtest/kernels). The host's kernel runs them
# directly, first and alone; every other kernel is fetched from Debian's
# archive through a private apt, booted in qemu from its unpacked package,
# with the host's root shared read-only over 9p and a tmpfs overlay on top,
# all guests side by side. One "NAME: N passed, N failed (S s, ...)" line per
# kernel; exit 1 if any kernel fails or docs/kernels.md disagrees with what
# the run found. Everything downloaded or built is cached under
# ${XDG_CACHE_HOME:-~/.cache}/lbctl/vmtest, so a warm run downloads nothing.
#
# Environment:
#   VMTEST_KERNELS   names from the matrix to run (default: all), e.g. "bookworm-6.1"
#   VMTEST_SKIP_HOST=1  leave out the host row (make test: its suites just ran)
#   VMTEST_PROFILE   vmtest (default) or test: which column of the matrix names the suites
#   VMTEST_SUITES    tap paths to run on every row instead
#   VMTEST_JOBS      guests at once (default: all of them)
#   VMTEST_SMP       vCPUs per guest (default 2)
#   VMTEST_TIMEOUT   seconds one guest may run (default 5700)
#   VMTEST_APPEND    more kernel command line for the guests (debugging)
#   VMTEST_REFRESH=1 read Debian's package lists and resolve the kernels again
#   VMTEST_UPDATE_DOCS=1  rewrite docs/kernels.md's rows from this run instead of checking them
#   VMTEST_KEYRING, VMTEST_MIRROR  Debian's archive keyring and mirror
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
here=$repo/scripts/vmtest
cache=${XDG_CACHE_HOME:-$HOME/.cache}/lbctl/vmtest
mkdir -p "$cache"/{debs,trees,initramfs,resolved,logs}
suites=${VMTEST_SUITES:-}
timeout_s=${VMTEST_TIMEOUT:-5700}
# The Node.js of scripts/node.env (scripts/bootstrap.sh installs it; make build runs that first).
# shellcheck source=scripts/node.env
. "$repo/scripts/node.env"
export PATH=$LBCTL_NODE_PREFIX/bin:$PATH

log() { printf 'vmtest: %s\n' "$*" >&2; }

need_tools() {
  local missing=()
  command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
  # (grep without -q: under pipefail an early exit would fail busybox with SIGPIPE)
  [[ -x /bin/busybox ]] && /bin/busybox --list | grep -x cpio >/dev/null || missing+=(busybox-static)
  command -v depmod >/dev/null || [[ -x /usr/sbin/depmod ]] || missing+=(kmod)
  command -v xz >/dev/null || missing+=(xz-utils) # Debian 13's kernel modules are .ko.xz
  [[ -r /usr/share/keyrings/debian-archive-keyring.gpg ]] || missing+=(debian-archive-keyring)
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# Debian's archive through a private apt: a source list, state and cache of
# its own under the vmtest cache, one per suite, checked against Debian's
# archive keyring (debian-archive-keyring, on every Debian machine). The
# machine's own apt configuration and lists are never read or written.
# SUITE -> prints apt options for that suite; refreshes its lists when missing.
debian_apt() {
  local suite=$1 dir=$cache/apt/$1
  local keyring=${VMTEST_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
  local mirror=${VMTEST_MIRROR:-http://deb.debian.org/debian}
  mkdir -p "$dir"/{lists/partial,archives/partial}
  [[ -r $keyring ]] || { log "no Debian archive keyring at $keyring (package debian-archive-keyring)"; return 1; }
  echo "deb [arch=amd64 signed-by=$keyring] $mirror $suite main" >"$dir/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir" -o "Dir::Cache::archives=$dir/archives"
    -o Dir::State::Status=/dev/null -o APT::Architecture=amd64 -o Debug::NoLocking=1
    -o APT::Sandbox::User=root -o Acquire::Languages=none)
  if [[ ! -s $dir/lists/.updated || ${VMTEST_REFRESH:-0} == 1 ]]; then
    log "apt: reading Debian $suite's package lists (private state in $dir)"
    apt-get "${opts[@]}" update -qq >&2 || { log "apt: update of $suite failed"; return 1; }
    date -u +%FT%TZ >"$dir/lists/.updated"
  fi
  printf '%s\n' "${opts[@]}"
}

# SUITE PKG (a metapackage such as linux-image-amd64) -> the versioned image package, cached.
resolve_debian() {
  local suite=$1 meta=$2 name=$3 file=$cache/resolved/$3
  if [[ -s $file && ${VMTEST_REFRESH:-0} != 1 ]]; then cat "$file"; return; fi
  local opts
  mapfile -t opts < <(debian_apt "$suite") && ((${#opts[@]})) || return 1
  local pkg
  pkg=$(apt-cache "${opts[@]}" depends "$meta" | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -1)
  [[ -n $pkg ]] || { log "cannot resolve $meta in Debian $suite to a kernel package"; return 1; }
  echo "$pkg" >"$file"
  echo "$pkg"
}

# SUITE PKG -> unpacked tree with a module index; prints the tree path. Downloads only when not cached.
prepare_tree() {
  local suite=$1 pkg=$2 kver=${2#linux-image-}
  local tree=$cache/trees/$kver
  if [[ ! -f $tree/.ready ]]; then
    local deb
    deb=$(ls "$cache"/debs/"${pkg}"_*.deb 2>/dev/null | head -1 || true)
    if [[ -z $deb ]]; then
      log "downloading $pkg from Debian $suite"
      local opts
      mapfile -t opts < <(debian_apt "$suite") && ((${#opts[@]})) || return 1
      # apt-get download checks the package against the signed Release file's hashes.
      (cd "$cache/debs" && apt-get "${opts[@]}" download -qq "$pkg") >&2
      deb=$(ls "$cache"/debs/"${pkg}"_*.deb | head -1)
    fi
    rm -rf "$tree"
    dpkg-deb -x "$deb" "$tree"
    # Debian 13's packages are usr-merged: modules under usr/lib/modules.
    [[ -e $tree/lib || ! -d $tree/usr/lib/modules ]] || ln -s usr/lib "$tree/lib"
    depmod -b "$tree" "$kver"
    touch "$tree/.ready"
  fi
  echo "$tree"
}

# TREE KVER -> initramfs path, keyed by the kernel and a hash of every input
# (the init script, the modprobe wrapper, busybox and the modules it holds).
prepare_initramfs() {
  local tree=$1 kver=$2
  local mods="virtio_pci 9pnet_virtio 9p overlay" m kos
  kos=$(for m in $mods; do
    modprobe -d "$tree" -S "$kver" --show-depends "$m" | awk '$1=="insmod"{print $2}'
  done | awk '!seen[$0]++')
  local key
  key=$( (cat "$here/init" "$here/modprobe.in" /bin/busybox; echo "$tree"; for m in $kos; do echo "$m"; cat "$m"; done) | sha256sum | cut -c1-16)
  local out=$cache/initramfs/$kver-$key.gz
  if [[ ! -f $out ]]; then
    local work
    work=$(mktemp -d)
    mkdir -p "$work"/{bin,sbin,proc,sys,dev,modules}
    cp /bin/busybox "$work/bin/busybox"
    install -m 755 "$here/init" "$work/init"
    sed "s|@TREE@|$tree|" "$here/modprobe.in" >"$work/sbin/modprobe"
    chmod 755 "$work/sbin/modprobe"
    : >"$work/modules.order"
    local ko base
    for ko in $kos; do
      # busybox insmod takes plain .ko files; newer Debian kernels (6.12) ship them xz- or zstd-compressed.
      base=${ko##*/}
      base=${base%.xz} base=${base%.zst}
      case $ko in
        *.xz) xz -dc "$ko" >"$work/modules/$base" ;;
        *.zst) zstd -qdc "$ko" >"$work/modules/$base" ;;
        *) cp "$ko" "$work/modules/$base" ;;
      esac
      basename "$base" .ko >>"$work/modules.order"
    done
    (cd "$work" && find . | /bin/busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$out.tmp"
    mv "$out.tmp" "$out"
    rm -rf "$work"
  fi
  echo "$out"
}

accel() {
  if [[ -e /dev/kvm && ( -d /sys/module/kvm_intel || -d /sys/module/kvm_amd ) ]]; then
    echo kvm
  else
    echo tcg
  fi
}

# NAME OUTDIR -> runs the suites on the host's kernel.
run_host() {
  local out=$2
  bash "$here/suites.sh" "$repo" "$out" >"$out/guest.log" 2>&1 || true
}

# NAME OUTDIR TREE KVER INITRD -> boots the kernel in qemu and runs the suites inside.
run_guest() {
  local name=$1 out=$2 tree=$3 kver=$4 initrd=$5 mode
  mode=$(accel)
  local cpu=(-accel tcg -cpu max)
  [[ $mode == kvm ]] && cpu=(-accel kvm -cpu host)
  echo "$mode" >"$out/accel"
  log "$name: booting $kver under $mode (console: $out/console.log)"
  local rc t0=$SECONDS attempt
  # A kernel that panics before lbctl's init runs (no guest.log, no
  # init-error) is booted once more: under TCG, 6.12 once died at 1.4 s of an
  # int3 in run_timer_softirq (a jump label patched while the other vCPU ran
  # it), which says nothing about lbctl. A panic once the suites run is a
  # result, and is reported as one.
  for attempt in 1 2; do
    rc=0
    timeout "$timeout_s" qemu-system-x86_64 "${cpu[@]}" -smp "${VMTEST_SMP:-2}" -m 4G \
      -kernel "$tree/boot/vmlinuz-$kver" -initrd "$initrd" \
      -append "console=ttyS0 panic=-1 quiet loglevel=4 lbctl.repo=$repo${VMTEST_APPEND:+ $VMTEST_APPEND}" \
      -nographic -serial "file:$out/console.log" -monitor none -no-reboot -nic none \
      -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
      -virtfs "local,path=$out,mount_tag=share,security_model=none,multidevs=remap" || rc=$?
    [[ $rc -eq 124 ]] && log "$name: timed out after ${timeout_s}s"
    if ((attempt == 1 && rc != 124)) && [[ ! -e $out/guest.log && ! -e $out/init-error ]] && grep -q 'Kernel panic' "$out/console.log" 2>/dev/null; then
      mv "$out/console.log" "$out/console-boot1.log"
      echo "the kernel panicked before init ($(grep -m1 -oE '(Oops|BUG|Kernel panic)[^[:cntrl:]]*' "$out/console-boot1.log" || echo 'see console-boot1.log')); booted again" >"$out/boot-retry"
      log "$name: $(cat "$out/boot-retry")"
      continue
    fi
    break
  done
  echo $((SECONDS - t0)) >"$out/seconds"
}

# NAME OUTDIR -> the row's result line, its notable lines; returns 1 if it failed.
report() {
  local name=$1 out=$2 passed=0 failed=1
  if [[ -f $out/done && -f $out/summary ]]; then
    read -r passed failed <"$out/summary"
  else
    log "$name: the guest left no result (panic, hang or init failure); console log kept"
    [[ -f $out/init-error ]] && log "$name: $(cat "$out/init-error")"
    tail -n 20 "$out/console.log" 2>/dev/null | sed 's/^/    /' >&2 || true
  fi
  grep -E '^(kernel|features|fallbacks|verifier: (FAIL|fallback)|verifier:   \|)|^tap: (not ok|rc|timed out|no summary)' "$out/guest.log" 2>/dev/null | sed "s/^/  $name | /" || true
  local why=''
  [[ -f $out/boot-retry ]] && why="; $(cat "$out/boot-retry")"
  [[ -f $out/done && -f $out/summary ]] || why="$why; no result: $(cat "$out/init-error" 2>/dev/null || echo 'panic, hang or init failure, see console.log')"
  printf '%s: %d passed, %d failed (%s s, %s%s)\n' "$name" "$passed" "$failed" "$(cat "$out/seconds" 2>/dev/null || echo '?')" "$(cat "$out/label")" "$why"
  ((failed == 0))
}

main() {
  make -C "$repo" --no-print-directory build typecheck >&2
  # One bundle a test file: a guest loads one in about 26 s instead of the
  # TypeScript loader's 38-42 s (scripts/vmtest/bundle-tests.mjs).
  node "$here/bundle-tests.mjs" >&2
  need_tools
  local profile=${VMTEST_PROFILE:-vmtest} stamp failed_kernels=0
  stamp=$(date +%Y%m%d-%H%M%S)
  local names=() outs=() hosts=() guests=()
  local name source vm_groups test_groups
  while read -r name source vm_groups test_groups _; do
    [[ -z $name || $name == \#* ]] && continue
    if [[ -n ${VMTEST_KERNELS:-} && " $VMTEST_KERNELS " != *" $name "* ]]; then continue; fi
    if [[ ${VMTEST_SKIP_HOST:-0} == 1 && $source == host ]]; then continue; fi
    local out=$cache/logs/$stamp-$name groups
    mkdir -p "$out"
    groups=$([[ $profile == test ]] && echo "$test_groups" || echo "$vm_groups")
    if [[ -n $suites ]]; then
      tr ' ' '\n' <<<"$suites" >"$out/suites"
    else
      node "$here/plan.mjs" $([[ $source == host ]] && echo --host) ${groups//,/ } >"$out/suites"
    fi
    names+=("$name")
    outs+=("$out")
    case $source in
      host)
        echo "$(uname -r), host" >"$out/label"
        hosts+=("$out")
        ;;
      debian:*)
        # Downloads and unpacking one at a time, before any guest boots.
        local spec=${source#debian:} pkg tree initrd kver
        if ! pkg=$(resolve_debian "${spec%%/*}" "${spec#*/}" "$name") || ! tree=$(prepare_tree "${spec%%/*}" "$pkg"); then
          echo "$source (not fetched)" >"$out/label"
          continue
        fi
        kver=${pkg#linux-image-}
        initrd=$(prepare_initramfs "$tree" "$kver")
        echo "$kver, $(accel)" >"$out/label"
        guests+=("$name|$out|$tree|$kver|$initrd")
        ;;
      *)
        log "$name: unknown source $source"
        echo "$source (unknown source)" >"$out/label"
        ;;
    esac
    log "$name: $(wc -l <"$out/suites") suite paths ($(tr '\n' ' ' <"$out/suites" | cut -c1-160)...)"
  done <"$here/kernels"

  # The host's suites first, alone: they measure timing on the real kernel.
  local o
  for o in "${hosts[@]}"; do
    local t0=$SECONDS
    bash "$here/suites.sh" "$repo" "$o" >"$o/guest.log" 2>&1 || true
    echo 0 >"$o/done"
    echo $((SECONDS - t0)) >"$o/seconds"
  done
  # Then the guests side by side (VMTEST_JOBS at a time; default all): each
  # is one qemu process, so 2 cores serve two guests at full speed.
  local jobs=${VMTEST_JOBS:-${#guests[@]}} running=0 g
  for g in "${guests[@]}"; do
    IFS='|' read -r name o tree kver initrd <<<"$g"
    run_guest "$name" "$o" "$tree" "$kver" "$initrd" &
    running=$((running + 1))
    if ((running >= jobs)); then
      wait -n || true
      running=$((running - 1))
    fi
  done
  wait || true

  local i
  for i in "${!names[@]}"; do
    if report "${names[$i]}" "${outs[$i]}"; then
      [[ -d ${outs[$i]} && $(cat "${outs[$i]}/label") != *host ]] && rm -f "${outs[$i]}/console.log" # kept only for failed runs
    else
      failed_kernels=$((failed_kernels + 1))
    fi
    log "${names[$i]}: logs in ${outs[$i]}"
  done
  # docs/kernels.md states what each kernel gets: checked against this run.
  if ! node "$here/kernels-doc.mjs" ${VMTEST_UPDATE_DOCS:+--write} "${outs[@]}"; then
    failed_kernels=$((failed_kernels + 1))
  fi
  return $((failed_kernels > 0))
}

main "$@"
