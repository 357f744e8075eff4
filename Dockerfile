# lbctl's container image, for a DaemonSet that replaces kube-proxy
# (docs/image.md). `make image` builds the same image without a container
# engine (scripts/image/build.sh: mmdebstrap + umoci); test/deploy/image.ts
# checks that the two agree: the runtime packages and versions pinned below,
# the paths COPYed into /opt/lbctl, ENTRYPOINT, CMD, ENV and STOPSIGNAL.
#
# Debian trixie on both stages: its nodejs is 20 (bookworm's is 18, older
# than package.json's engines), its libbpf1 is 1.5 (SONAME libbpf.so.1, the
# one the addon links) and it has libelf1t64 and zlib.

# ---------------------------------------------------------------- build
FROM debian:trixie-slim AS build
# The toolchain of `make bpf native ts` (scripts/bootstrap.sh installs the
# same on a workstation, with the test tools this stage does not need).
# libnode-dev and npm_config_nodedir: node-gyp builds the addon against
# Debian's node headers in /usr/include/node instead of downloading some.
ENV npm_config_nodedir=/usr
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      clang llvm libbpf-dev libelf-dev zlib1g-dev linux-libc-dev \
      make g++ python3 pkg-config nodejs npm libnode-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY package.json package-lock.json ./
# What scripts/bootstrap.sh does for node_modules, stamp included, so make
# does not run bootstrap (and its apt-get for test tools) again.
RUN npm ci --no-audit --no-fund --ignore-scripts \
 && sha256sum package-lock.json | cut -d' ' -f1 >node_modules/.lbctl-lock-hash
COPY . .
# The runtime objects, the addon and the bundle (not `make build`: its ABI
# check needs bpftool, and the sources were checked where they were built).
RUN make bpf native ts

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
# status. nodejs, libbpf1 and libelf1t64 run the agent; mount mounts bpffs
# when /sys/fs/bpf is not (src/datapath/bpffs.ts); iptables (legacy and nft)
# and nftables are for `lbctl cleanup --kube-proxy`, which removes
# kube-proxy's rules; iproute2 is for looking at devices and tc from
# `kubectl exec`; tini is PID 1 (below).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      nodejs=20.19.2+dfsg-1+deb13u3 \
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
# bpf/.output beside it and the addon from build/Release.
COPY package.json /opt/lbctl/package.json
COPY bin/lbctl /opt/lbctl/bin/lbctl
COPY --from=build /src/dist/bundle/lbctl.js /opt/lbctl/dist/bundle/lbctl.js
COPY --from=build /src/build/Release/lb_native.node /opt/lbctl/build/Release/lb_native.node
COPY --from=build /src/bpf/.output/sock.bpf.o /src/bpf/.output/sock_compat.bpf.o /src/bpf/.output/nodeport.bpf.o /src/bpf/.output/nodeport_l3.bpf.o /src/bpf/.output/sock_destroy.bpf.o /src/bpf/.output/probe.bpf.o /opt/lbctl/bpf/.output/
RUN ln -s /opt/lbctl/bin/lbctl /usr/local/bin/lbctl
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
# settings for anything else run in the image.
# Debian's node adds /etc/ssl/certs/ca-certificates.crt to its CA store
# and warns on every TLS use when the file is missing: the agent trusts
# node's own CA store and the cluster CA its kubeconfig or service account
# names, so an empty NODE_EXTRA_CA_CERTS turns that off rather than
# installing ca-certificates (and openssl) for nothing.
ENV MALLOC_ARENA_MAX=1 \
    MALLOC_MMAP_THRESHOLD_=65536 \
    MALLOC_TRIM_THRESHOLD_=1048576 \
    NODE_EXTRA_CA_CERTS=""
ENTRYPOINT ["/usr/bin/tini-static", "--", "/opt/lbctl/bin/lbctl"]
CMD ["agent"]
STOPSIGNAL SIGTERM
LABEL org.opencontainers.image.title="lbctl" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.description="eBPF service load balancer: a kube-proxy replacement"
