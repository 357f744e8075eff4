# lbctl's container image, for a DaemonSet that replaces kube-proxy
# (docs/image.md). `make image` builds the same image without a container
# engine (scripts/image/build.sh: mmdebstrap + umoci); test/deploy/image.ts
# checks that the two agree: the runtime packages and versions pinned below,
# the paths COPYed into /opt/lbctl, ENTRYPOINT, CMD, ENV and STOPSIGNAL.
#
# Debian trixie on both stages: its libbpf1 is 1.5 (SONAME libbpf.so.1, the
# one the addon links) and it has libelf1t64 and zlib. Node.js is not
# Debian's (trixie's nodejs is 20, end-of-life): the build stage installs the
# one of scripts/node.env as scripts/bootstrap.sh does on a workstation, and
# the image ships its node binary.

# ---------------------------------------------------------------- build
FROM debian:trixie-slim AS build
# The toolchain of `make bpf native ts` (scripts/bootstrap.sh installs the
# same on a workstation, with the test tools this stage does not need), and
# curl for Node.js.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      clang llvm libbpf-dev libelf-dev zlib1g-dev linux-libc-dev \
      make g++ python3 pkg-config curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Node.js and npm from the npm registry, checked against the integrities
# pinned in scripts/node.env (scripts/install-node.sh), into /opt/node:
# make's LBCTL_NODE_PREFIX below, so node-gyp builds the addon against its
# include/node and nothing is downloaded for it.
COPY scripts/node.env scripts/install-node.sh scripts/
RUN bash scripts/install-node.sh /opt/node
ENV PATH=/opt/node/bin:$PATH
COPY package.json package-lock.json ./
# What scripts/bootstrap.sh does for node_modules, stamp included, so make
# does not run bootstrap (and its apt-get for test tools) again.
RUN npm ci --no-audit --no-fund --ignore-scripts \
 && sha256sum package-lock.json | cut -d' ' -f1 >node_modules/.lbctl-lock-hash
COPY . .
# The runtime objects, the addon and the bundle (not `make build`: its ABI
# check needs bpftool, and the sources were checked where they were built).
# The build context has no .git: `lbctl version` names the commit given as
# --build-arg LBCTL_COMMIT=$(git rev-parse HEAD).
ARG LBCTL_COMMIT=unknown
RUN make bpf native ts LBCTL_NODE_PREFIX=/opt/node LBCTL_COMMIT="$LBCTL_COMMIT"

# -------------------------------------------------------------- runtime
FROM debian:trixie-slim
# Root, because a BPF loader cannot run as non-root: the agent loads and
# attaches cgroup and tc programs and pins them under /sys/fs/bpf, which
# takes CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN in the node's own user
# namespace, and writes root-owned bpffs and cgroup files. A non-root USER
# would need the same capabilities made ambient: no less privilege, more
# moving parts. The DaemonSet runs it as root with those capabilities and
# without privilege (deploy/base/daemonset.yaml, docs/deploy.md).
#
# The packages are pinned: `make image` installs exactly these (it reads
# this list), and the image test compares them with the image's dpkg
# status. libstdc++6 (node and the addon are C++), libbpf1 and libelf1t64
# run the agent; mount mounts bpffs
# when /sys/fs/bpf is not (src/datapath/bpffs.ts); iptables (legacy and nft)
# and nftables are for `lbctl cleanup --kube-proxy`, which removes
# kube-proxy's rules; iproute2 is for looking at devices and tc from
# `kubectl exec`; tini is PID 1 (below).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libstdc++6=14.2.0-19 \
      libbpf1=1:1.5.0-3 \
      libelf1t64=0.192-4 \
      mount=2.41.5-0+deb13u1 \
      iptables=1.8.11-2 \
      nftables=1.1.3-1 \
      iproute2=6.15.0-1 \
      tini=0.19.0-3+b8 \
 && rm -rf /var/lib/apt/lists/*
# Only what the agent and the CLI read at run time: the esbuild bundle is
# self-contained (no node_modules), the agent loads the objects from
# bpf/.output beside it and the addon from build/Release. Node.js: the
# build stage's node binary (the official linux-x64 build; it needs only
# glibc and libstdc++) and its licence, on PATH as /usr/local/bin/node,
# which bin/lbctl runs.
COPY --from=build /opt/node/bin/node /opt/lbctl/node/bin/node
COPY --from=build /opt/node/LICENSE /opt/lbctl/node/LICENSE
COPY package.json /opt/lbctl/package.json
COPY bin/lbctl /opt/lbctl/bin/lbctl
COPY --from=build /src/dist/bundle/lbctl.js /opt/lbctl/dist/bundle/lbctl.js
COPY --from=build /src/build/Release/lb_native.node /opt/lbctl/build/Release/lb_native.node
COPY --from=build /src/bpf/.output/sock.bpf.o /src/bpf/.output/sock_compat.bpf.o /src/bpf/.output/nodeport.bpf.o /src/bpf/.output/nodeport_l3.bpf.o /src/bpf/.output/nodeport_xdp.bpf.o /src/bpf/.output/sock_destroy.bpf.o /src/bpf/.output/probe.bpf.o /opt/lbctl/bpf/.output/
RUN ln -s /opt/lbctl/bin/lbctl /usr/local/bin/lbctl \
 && ln -s /opt/lbctl/node/bin/node /usr/local/bin/node
# PID 1 is tini, which blocks every signal first thing and forwards it to
# its child: the kernel drops a signal PID 1 neither handles nor blocks, so
# with node as PID 1 a SIGTERM in the first few hundred ms (the shell of
# bin/lbctl, node's own start) was lost and the kubelet waited out the grace
# period. Its child is bin/lbctl: node and malloc settings, and V8's heap
# cap derived from the container's memory limit (docs/deploy.md, "Memory");
# it execs node, which gets SIGTERM from tini: the agent stops and leaves
# the datapath attached from its pins (src/cli/commands/agent.ts), and a
# node that has no handler yet just ends. tini-static: no dynamic loader
# runs before it blocks signals. The ENV below repeats bin/lbctl's malloc
# settings for anything else run in the image. (The official node build
# trusts its own CA store and reads no system bundle: the agent needs only
# that and the cluster CA its kubeconfig or service account names.)
ENV MALLOC_ARENA_MAX=1 \
    MALLOC_MMAP_THRESHOLD_=65536 \
    MALLOC_TRIM_THRESHOLD_=1048576
ENTRYPOINT ["/usr/bin/tini-static", "--", "/opt/lbctl/bin/lbctl"]
CMD ["agent"]
STOPSIGNAL SIGTERM
LABEL org.opencontainers.image.title="lbctl" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.description="eBPF service load balancer: a kube-proxy replacement"
