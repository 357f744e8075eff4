# lbctl build graph. `make demo` and `make test` are the two entry points a
# fresh machine needs; both bootstrap first (scripts/bootstrap.sh installs
# only what is missing).
.DELETE_ON_ERROR:
.SECONDARY:
SHELL := /bin/bash

# Node.js 24 in its private prefix (scripts/node.env; scripts/bootstrap.sh
# installs it): first on PATH for every recipe, so node, npm, npx, tap,
# node-gyp and bin/lbctl run on it and never on a Node the machine has.
include scripts/node.env
export PATH := $(LBCTL_NODE_PREFIX)/bin:$(PATH)

CLANG     ?= clang
BPFTOOL   ?= $(shell command -v bpftool || echo /usr/sbin/bpftool)
ARCH_INC  := /usr/include/$(shell gcc -dumpmachine)
OUT       := bpf/.output
BPF_SRCS  := bpf/sock.c bpf/nodeport.c bpf/abi.c
BPF_OBJS  := $(patsubst bpf/%.c,$(OUT)/%.bpf.o,$(BPF_SRCS)) $(OUT)/sock_compat.bpf.o
# Loaded only where the kernel has bpf_sock_destroy (6.5+), and not an input
# of the ABI generator: its maps are the agent's private scratch space (keyed
# by ABI structs that sock.bpf.o already exports), not datapath maps.
SOCK_DESTROY_OBJ := $(OUT)/sock_destroy.bpf.o
# The agent's kernel feature probes (src/datapath/features.ts), loaded one
# program at a time; no datapath maps.
PROBE_OBJ := $(OUT)/probe.bpf.o
BPF_HDRS  := $(wildcard bpf/include/*.h bpf/lib/*.h)
BPF_TEST_SRCS := $(wildcard bpf/tests/*.c)
BPF_TEST_OBJS := $(patsubst bpf/tests/%.c,$(OUT)/tests/%.bpf.o,$(BPF_TEST_SRCS))
# No vmlinux.h: the socket hooks need only UAPI (linux-libc-dev) and libbpf
# headers, which keeps one object loadable on every kernel we test.
# -ffile-prefix-map: the debug info names sources relative to the checkout,
# so an object's bytes, and so its build id in `lbctl version` (the SHA-256
# of the file), depend on the sources and clang, not on where the checkout is.
BPF_CFLAGS := -O2 -g -target bpf -Wall -Werror -I$(ARCH_INC) -Ibpf -ffile-prefix-map=$(CURDIR)=.
NATIVE    := build/Release/lb_native.node
TS_SRCS   := $(shell find src -name '*.ts' 2>/dev/null)
STAMP     := node_modules/.lbctl-lock-hash
BUNDLE    := dist/bundle/lbctl.js

.PHONY: all build bootstrap bpf native ts gen check-gen check-layers typecheck image vmtest test test-host test-vm test-unit test-bpf test-e2e demo bench bench-quick bench-runtimes bench-deps clean cleanup cluster-up cluster-down test-cluster test-conformance

all: build

bootstrap $(STAMP):
	@bash scripts/bootstrap.sh

build: bootstrap bpf native ts check-gen

# A variant with other map layouts, for test/e2e/upgrade-layout.ts only: not an
# input of the ABI generator and never loaded by the agent unless told to.
LAYOUT_TEST_OBJ := $(OUT)/sock_layout_test.bpf.o $(OUT)/sock_layout_test_compat.bpf.o
# The BPF unit tests (bpf/tests/sock_test.c includes bpf/sock.c) for kernels
# without bpf_set_retval, as the datapath has its compat build.
COMPAT_TEST_OBJ := $(OUT)/tests/sock_compat_test.bpf.o

# Variants of the tc object for test/e2e/nodeport-upgrade.ts only (started
# with --tc-object, then upgraded from): the previous release's CT layout
# (SNAT translations in lb*_ct), and another layout of the CT entries.
NP_UPGRADE_TEST_OBJS := $(OUT)/tests/nodeport_nat_in_ct.bpf.o $(OUT)/tests/nodeport_ct_layout.bpf.o

# The tc object for layer-3 tunnels: loaded beside nodeport.bpf.o, its maps
# the same (not an input of the ABI generator).
NP_L3_OBJ := $(OUT)/nodeport_l3.bpf.o
# The XDP acceleration of its ingress (--nodeport-acceleration): the same
# source built for XDP, loaded beside nodeport.bpf.o on its maps.
NP_XDP_OBJ := $(OUT)/nodeport_xdp.bpf.o

bpf: $(BPF_OBJS) $(NP_L3_OBJ) $(NP_XDP_OBJ) $(SOCK_DESTROY_OBJ) $(PROBE_OBJ) $(BPF_TEST_OBJS) $(COMPAT_TEST_OBJ) $(LAYOUT_TEST_OBJ) $(NP_UPGRADE_TEST_OBJS)

$(OUT)/%.bpf.o: bpf/%.c $(BPF_HDRS) | $(OUT)
	$(CLANG) $(BPF_CFLAGS) -c $< -o $@

# The tc programs for layer-3 tunnels (ipip, sit, ip6tnl, gre, wireguard):
# the same source, packets starting with their IP header.
$(OUT)/nodeport_l3.bpf.o: bpf/nodeport.c $(BPF_HDRS) | $(OUT)
	$(CLANG) $(BPF_CFLAGS) -DNP_L3_DEVICE -c $< -o $@

# The ingress path at XDP: what it cannot finish it passes on to tc.
$(OUT)/nodeport_xdp.bpf.o: bpf/nodeport.c $(BPF_HDRS) | $(OUT)
	$(CLANG) $(BPF_CFLAGS) -DNP_XDP -c $< -o $@

# Kernels before 5.18 lack bpf_set_retval: same programs, refusals are EPERM.
$(OUT)/sock_compat.bpf.o: bpf/sock.c $(BPF_HDRS) | $(OUT)
	$(CLANG) $(BPF_CFLAGS) -DLB_HAVE_SET_RETVAL=0 -c $< -o $@

$(OUT)/sock_layout_test.bpf.o: bpf/sock.c $(BPF_HDRS) | $(OUT)
	$(CLANG) $(BPF_CFLAGS) -DLB_LAYOUT_TEST -c $< -o $@

$(OUT)/sock_layout_test_compat.bpf.o: bpf/sock.c $(BPF_HDRS) | $(OUT)
	$(CLANG) $(BPF_CFLAGS) -DLB_LAYOUT_TEST -DLB_HAVE_SET_RETVAL=0 -c $< -o $@

$(COMPAT_TEST_OBJ): bpf/tests/sock_test.c bpf/sock.c $(BPF_HDRS) | $(OUT)
	@mkdir -p $(OUT)/tests
	$(CLANG) $(BPF_CFLAGS) -DLB_HAVE_SET_RETVAL=0 -c $< -o $@

$(OUT)/tests/nodeport_nat_in_ct.bpf.o: bpf/nodeport.c $(BPF_HDRS) | $(OUT)
	@mkdir -p $(OUT)/tests
	$(CLANG) $(BPF_CFLAGS) -DLB_NAT_IN_CT -c $< -o $@

$(OUT)/tests/nodeport_ct_layout.bpf.o: bpf/nodeport.c $(BPF_HDRS) | $(OUT)
	@mkdir -p $(OUT)/tests
	$(CLANG) $(BPF_CFLAGS) -DLB_CT_LAYOUT_TEST -c $< -o $@

$(OUT)/tests/%.bpf.o: bpf/tests/%.c bpf/sock.c $(BPF_HDRS) | $(OUT)
	@mkdir -p $(OUT)/tests
	$(CLANG) $(BPF_CFLAGS) -c $< -o $@

$(OUT)/tests/sock_destroy_test.bpf.o: bpf/sock_destroy.c
# A program without BTF (test/native/tc.ts): the same rule without -g.
$(OUT)/tests/tc_nobtf_test.bpf.o: BPF_CFLAGS := $(filter-out -g,$(BPF_CFLAGS))
$(OUT)/tests/nodeport_test.bpf.o: bpf/nodeport.c

$(OUT):
	@mkdir -p $@

native: $(NATIVE)

# Against the headers of the Node.js that runs it (include/node in its
# prefix): no download, and a Node.js bump (scripts/node.env) rebuilds it.
# node-gyp lets an npm_config_nodedir in its environment override its
# --nodedir flag, and npx exports one from an npmrc's nodedir (a machine's
# ~/.npmrc may name Debian's /usr): so the variable, not the flag.
$(NATIVE): binding.gyp $(wildcard native/*.cc native/*.h) $(STAMP) scripts/node.env
	npm_config_nodedir=$(LBCTL_NODE_PREFIX) npx --no-install node-gyp rebuild --silent

ts: dist/.stamp $(BUNDLE)

dist/.stamp: $(TS_SRCS) tsconfig.json $(STAMP)
	npx --no-install tsc -p tsconfig.json
	@touch $@

# bin/lbctl runs one esbuild bundle of the CLI and what it imports: only the
# parts of @kubernetes/client-node it uses are loaded: at 1 service the agent
# measured 95 instead of 141 MiB, and started in 0.25 instead of 0.75 s
# (docs/benchmarks.md, "Memory"). Its source
# map points into src/ (NODE_OPTIONS=--enable-source-maps to use it).
# Whitespace and comments are left out (names are kept, for stack traces):
# V8 holds a script's source for as long as it runs, and the comments of
# the CLI and its libraries held characters above U+00FF, which made it
# keep all 4 MB of the source at two bytes a character: 7.8 MiB. Without
# them the source is 2.7 MB of ASCII; the build fails if a character above
# U+007F comes back (escape it in the source: \u00b5).
#
# The commit is baked in (`lbctl version`; the image has no .git): HEAD, with
# -dirty when tracked files differ from it, or LBCTL_COMMIT for a build
# without git (the Dockerfile's). dist/commit is rewritten, when make reads
# this file, only if that changed: the bundle follows HEAD, and make -q still
# says whether anything is stale.
COMMIT_FILE := dist/commit
ifndef LBCTL_COMMIT
LBCTL_COMMIT := $(shell c=$$(git rev-parse HEAD 2>/dev/null) && { git diff --quiet HEAD -- 2>/dev/null || c=$$c-dirty; echo $$c; } || echo unknown)
endif
$(shell mkdir -p dist && { [ "$$(cat $(COMMIT_FILE) 2>/dev/null)" = "$(LBCTL_COMMIT)" ] || echo "$(LBCTL_COMMIT)" >$(COMMIT_FILE); })

$(BUNDLE): dist/.stamp $(COMMIT_FILE)
	npx --no-install esbuild dist/cli/main.js --bundle --platform=node --format=esm --target=node24 \
	  --minify-whitespace --sourcemap --log-level=warning --outfile=$@ \
	  --define:__LBCTL_COMMIT__='"$(shell cat $(COMMIT_FILE))"' \
	  --banner:js="import { createRequire as lbctlCreateRequire } from 'node:module'; const require = lbctlCreateRequire(import.meta.url);"
	@node scripts/check-ascii.mjs $@ || { rm -f $@; exit 1; }

# The TypeScript codecs come from the objects' BTF; `gen` rewrites them,
# `check-gen` fails the build when the checked-in file is stale.
gen: $(BPF_OBJS)
	node scripts/gen-abi.mjs --bpftool $(BPFTOOL) $(BPF_OBJS) > src/datapath/abi.gen.ts

check-gen: $(BPF_OBJS)
	@node scripts/gen-abi.mjs --bpftool $(BPFTOOL) $(BPF_OBJS) | diff -u src/datapath/abi.gen.ts - >/dev/null \
	  || { echo "src/datapath/abi.gen.ts is stale: run 'make gen' and commit it" >&2; \
	       node scripts/gen-abi.mjs --bpftool $(BPFTOOL) $(BPF_OBJS) | diff -u src/datapath/abi.gen.ts - | head -40 >&2; exit 1; }

# The container image of the Dockerfile, built without a container engine
# (scripts/image/build.sh, docs/image.md): an OCI archive for podman load,
# skopeo or ctr. Debian packages come from trixie through mmdebstrap; they
# and the base layer are cached in ~/.cache/lbctl/image.
VERSION   := $(shell node -p "require('./package.json').version" 2>/dev/null)
IMAGE     := build/image/lbctl-$(VERSION).oci.tar
# What the image ships in /opt/lbctl; the Dockerfile COPYs the same paths
# (test/deploy/image.ts compares), and build.sh adds the node binary of
# LBCTL_NODE_PREFIX as /opt/lbctl/node/bin/node. package.json marks the ESM bundle as a
# module; bin/lbctl is the CLI for `kubectl exec`. The agent loads these five
# objects (src/datapath/{loader,features,nodeport,terminate}.ts); abi.bpf.o
# and the test objects never are. No node_modules: the bundle is
# self-contained (its only bare requires are optional ones, behind a try).
IMAGE_FILES := package.json bin/lbctl $(BUNDLE) $(NATIVE) $(addprefix $(OUT)/,sock.bpf.o sock_compat.bpf.o nodeport.bpf.o nodeport_l3.bpf.o nodeport_xdp.bpf.o sock_destroy.bpf.o probe.bpf.o)

image: build $(IMAGE)

$(IMAGE): Dockerfile scripts/image/build.sh $(IMAGE_FILES) scripts/node.env $(LBCTL_NODE_PREFIX)/bin/node
	@bash scripts/bootstrap.sh --image
	bash scripts/image/build.sh $@ $(IMAGE_FILES)

# src/'s imports against docs/architecture.md's layering table, and no
# import cycle (scripts/check-layers.mjs, dependency-cruiser): a few seconds
# and no build, so `make test` runs it first.
check-layers: bootstrap
	node scripts/check-layers.mjs

# Type-checks the tests too (tap runs them transpile-only).
typecheck: $(STAMP)
	npx --no-install tsc -p tsconfig.test.json

# Every suite on this kernel, the real cluster (kubelet, containerd, lbctl's
# image, Kubernetes' conformance specs), then the kernel suites on the other
# kernels of scripts/vmtest/kernels in qemu (make test: about 70 min under
# TCG on 2 cores, docs/testing.md).
test: test-host test-cluster test-vm

# One vCPU a guest: the guests run side by side on the machine's two cores,
# and two vCPUs each overcommit them (a vCPU waits on its descheduled
# sibling's spinlocks and IPIs): the same files took 22-28% longer with two
# (docs/testing.md). make vmtest keeps two.
test-vm: check-layers build typecheck
	VMTEST_SKIP_HOST=1 VMTEST_PROFILE=test VMTEST_SMP=1 bash scripts/vmtest/vmtest.sh

# On a failure the failing assertions are named again at the end, where
# CI's excerpt of the output (its last lines) shows them.
test-host: check-layers build typecheck image
	@mkdir -p .tap
	set -o pipefail; npx --no-install tap test/unit test/native test/bpf test/e2e test/deploy 2>&1 | tee .tap/host.log || \
	  { echo '# the failed assertions (the whole output is above):'; grep 'not ok' .tap/host.log | tail -40; exit 1; }

test-unit: build
	npx --no-install tap test/unit

test-bpf: build
	npx --no-install tap test/native test/bpf

test-e2e: build
	npx --no-install tap test/e2e

# The suites on every kernel of scripts/vmtest/kernels (qemu for non-host ones).
vmtest: build typecheck
	bash scripts/vmtest/vmtest.sh

demo: build
	bash scripts/demo.sh

# lbctl against kube-proxy's iptables and nftables modes and the floor
# (docs/benchmarks.md). Results: bench/results/ (markdown, JSON, plots).
BENCH_RUN := TS_NODE_TRANSPILE_ONLY=1 node --import=@tapjs/typescript/import bench/run.ts
bench-deps:
	@bash scripts/bootstrap.sh --bench

# The file source's cold load: 10,000 Services and 10,000 EndpointSlices
# renamed into the directory, to programmed (bench/results/file-load.md).
BENCH_FILE_LOAD := TS_NODE_TRANSPILE_ONLY=1 node --import=@tapjs/typescript/import bench/file-load.ts

# The tc datapath (NodePort, issue 14): ns per packet under BPF_PROG_TEST_RUN
# at 1 to 100,000 services and the Maglev tables from cold and per change
# (bench/nodeport-tc.ts, in a private network namespace), then NodePort end
# to end through the NodePort test lab against kube-proxy's iptables and
# nftables modes and the routed pod (bench/nodeport-e2e.ts; client, node and
# pods on CPU 1, the bench and lbctl's agents off it). Results:
# bench/results/nodeport-{tc,e2e}.{md,json}.
BENCH_NP_TC := TS_NODE_TRANSPILE_ONLY=1 node --import=@tapjs/typescript/import bench/nodeport-tc.ts
BENCH_NP_E2E := TS_NODE_TRANSPILE_ONLY=1 node --import=@tapjs/typescript/import bench/nodeport-e2e.ts

# Standalone mode's probes (issue 17): 1,000 backends at periodSeconds 1 with
# each handler, and with half of them hanging (bench/results/probes.{md,json}).
BENCH_PROBES := TS_NODE_TRANSPILE_ONLY=1 node --expose-gc --import=@tapjs/typescript/import bench/probes.ts

# The run's record: the figures of docs/benchmarks.md's tables, one JSON
# file per run in bench/results/runs/ (bench/record.ts).
BENCH_RECORD := TS_NODE_TRANSPILE_ONLY=1 node --import=@tapjs/typescript/import bench/record.ts

bench: build bench-deps
	$(BENCH_RUN) $(BENCH_ARGS)
	$(BENCH_FILE_LOAD)
	$(BENCH_NP_TC)
	$(BENCH_NP_E2E)
	$(BENCH_PROBES)
	$(BENCH_RECORD)

# The scale rows on two Node.js runtimes, alternated (bench/runtimes.ts):
# scripts/node.env's and BENCH_OTHER_NODE's. Results:
# bench/results/runtimes.{json,md}. BENCH_LOCK=FILE runs each bench under
# flock on FILE; BENCH_RUNTIMES_ARGS: --rounds, --sizes, --work.
BENCH_OTHER_NODE ?= /usr/bin/node
bench-runtimes: build bench-deps
	TS_NODE_TRANSPILE_ONLY=1 node --import=@tapjs/typescript/import $(CURDIR)/bench/runtimes.ts \
	  --runtime node$$($(BENCH_OTHER_NODE) -p 'process.versions.node.split(".")[0]')=$(BENCH_OTHER_NODE) \
	  --runtime node$$(node -p 'process.versions.node.split(".")[0]')=$(LBCTL_NODE_PREFIX)/bin/node \
	  $(if $(BENCH_LOCK),--lock $(BENCH_LOCK)) $(BENCH_RUNTIMES_ARGS)

bench-quick: build bench-deps
	$(BENCH_RUN) --quick --out bench/results-quick $(BENCH_ARGS)
	$(BENCH_FILE_LOAD) --reps 1 --out bench/results-quick
	$(BENCH_NP_TC) --quick --out bench/results-quick
	$(BENCH_NP_E2E) --quick --out bench/results-quick
	$(BENCH_PROBES) --window 3 --out bench/results-quick
	$(BENCH_RECORD) --out bench/results-quick

# A Kubernetes cluster on this machine, in namespaces and cgroups of its own
# (docs/cluster.md): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and two nodes (containerd, kubelet). The binaries come from
# CLUSTER_K8S_DIR (../shared/kubernetes/v1.24.0-alpha.1); what is unpacked
# or built is cached in ~/.cache/lbctl/cluster. scripts/cluster/kubectl.sh
# is kubectl against it.
cluster-up:
	@bash scripts/bootstrap.sh --cluster
	bash scripts/cluster/up.sh

cluster-down:
	bash scripts/cluster/down.sh

# The suites against the real cluster (test/cluster/): each brings it up
# and down itself; lbctl's own run the image `make image` builds.
test-cluster: $(STAMP) image
	@bash scripts/bootstrap.sh --cluster
	@mkdir -p .tap
	set -o pipefail; npx --no-install tap test/cluster 2>&1 | tee .tap/cluster.log || \
	  { echo '# the failed assertions (the whole output is above):'; grep 'not ok' .tap/cluster.log | tail -40; exit 1; }

# Kubernetes' 18 Services conformance specs (e2e.test) against the real
# cluster with lbctl and no kube-proxy (docs/conformance.md); also part of
# test-cluster. LBCTL_CONFORMANCE_PROXY=kube-proxy runs the baseline.
test-conformance: $(STAMP) image
	@bash scripts/bootstrap.sh --cluster
	npx --no-install tap test/cluster/conformance.ts

cleanup:
	./bin/lbctl cleanup

clean:
	rm -rf $(OUT) build dist
