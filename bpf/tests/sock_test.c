// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Unit tests of the socket datapath's helpers, run through BPF_PROG_TEST_RUN.
 * cgroup sock_addr programs cannot be test-run, so this object includes
 * sock.c (maps unpinned) and drives __sock{4,6}_xlate_{fwd,rev} from tc
 * programs. Each test returns 0, or the line of the first failed check
 * (test/bpf/sock-unit.ts runs every `test_*` program).
 */
#include <linux/types.h>
#define LB_MAP_PINNING LIBBPF_PIN_NONE
/* The client's network namespace, as the tests choose it. */
volatile __u64 test_netns_cookie = 1;
#define lb_netns_cookie(ctx) test_netns_cookie
#include "../sock.c"

#define CHECK(cond)                     \
	do {                            \
		if (!(cond))            \
			return __LINE__; \
	} while (0)

#define SVC_IP		bpf_htonl(0x0a60000a)	/* 10.96.0.10 */
#define SVC_PORT	bpf_htons(80)
#define BE1_IP		bpf_htonl(0x0af40102)	/* 10.244.1.2 */
#define BE2_IP		bpf_htonl(0x0af40103)	/* 10.244.1.3 */
#define BE_PORT		bpf_htons(8080)
#define REVNAT		7
#define WIDE_REVNAT	0x10007		/* above 16 bits; truncates to REVNAT */

static __always_inline void put_master4_id(__be32 addr, __be16 port, __u8 proto, __u16 count, __u8 type,
					   __u8 flags, __u32 affinity_timeout, __u32 rev_nat_index)
{
	struct lb4_key key = { .address = addr, .dport = port, .proto = proto };
	struct lb_service svc = { .count = count, .rev_nat_index = rev_nat_index, .type = type,
				  .flags = flags, .affinity_timeout = affinity_timeout };

	bpf_map_update_elem(&lb4_services, &key, &svc, BPF_ANY);
}

static __always_inline void put_master4_flags(__be32 addr, __be16 port, __u8 proto, __u16 count, __u8 type,
					      __u8 flags, __u32 affinity_timeout)
{
	put_master4_id(addr, port, proto, count, type, flags, affinity_timeout, REVNAT);
}

static __always_inline void put_master4(__be32 addr, __be16 port, __u8 proto, __u16 count, __u8 type)
{
	put_master4_flags(addr, port, proto, count, type, 0, 0);
}

static __always_inline void put_backend4(__u16 slot, __u32 id, __be32 addr)
{
	struct lb4_key key = { .address = SVC_IP, .dport = SVC_PORT, .proto = IPPROTO_TCP, .backend_slot = slot };
	struct lb_service svc = { .backend_id = id };
	struct lb4_backend be = { .address = addr, .port = BE_PORT, .proto = IPPROTO_TCP };

	bpf_map_update_elem(&lb4_backends, &id, &be, BPF_ANY);
	bpf_map_update_elem(&lb4_services, &key, &svc, BPF_ANY);
}

static __always_inline void clear4(void)
{
	struct lb4_key key = { .address = SVC_IP, .dport = SVC_PORT, .proto = IPPROTO_TCP };
	struct lb4_key wild = { .address = SVC_IP };
	__u32 id1 = 1, id2 = 2;

	bpf_map_delete_elem(&lb4_services, &key);
	key.backend_slot = 1;
	bpf_map_delete_elem(&lb4_services, &key);
	key.backend_slot = 2;
	bpf_map_delete_elem(&lb4_services, &key);
	bpf_map_delete_elem(&lb4_services, &wild);
	bpf_map_delete_elem(&lb4_backends, &id1);
	bpf_map_delete_elem(&lb4_backends, &id2);
}

/* This test socket's TCP rev-NAT slot (lb4_sock_peer), or NULL. */
static __always_inline struct lb4_sock_peer *peer4_of(struct __sk_buff *skb)
{
	return (struct lb4_sock_peer *)sock_peer_find(&lb4_sock_peer, bpf_get_socket_cookie(skb));
}

SEC("tc")
int test_fwd_not_a_service(struct __sk_buff *skb)
{
	__be32 addr = bpf_htonl(0x01020304);
	__be16 port = SVC_PORT;

	clear4();
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == -LB_NOT_SERVICE);
	CHECK(addr == bpf_htonl(0x01020304) && port == SVC_PORT);
	return 0;
}

SEC("tc")
int test_fwd_translates_and_records_revnat(struct __sk_buff *skb)
{
	struct lb4_sock_key skey = { .address = BE1_IP, .port = BE_PORT };
	struct lb4_sock_peer *peer;
	__be32 addr = SVC_IP;
	__be16 port = SVC_PORT;

	clear4();
	put_backend4(1, 1, BE1_IP);
	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == 0);
	CHECK(addr == BE1_IP && port == BE_PORT);

	peer = peer4_of(skb);
	CHECK(peer && peer->backend == BE1_IP && peer->backend_port == BE_PORT);
	CHECK(peer->address == SVC_IP && peer->port == SVC_PORT && peer->rev_nat_index == REVNAT);
	/* a TCP socket's entry is its slot, not an LRU entry */
	skey.cookie = bpf_get_socket_cookie(skb);
	CHECK(!bpf_map_lookup_elem(&lb4_sock_revnat, &skey));

	/* another backend's address on this socket is not translated */
	addr = BE2_IP;
	CHECK(__sock4_xlate_rev(skb, IPPROTO_TCP, &addr, &port) == -ENOENT);
	addr = BE1_IP;

	/* and back: the reply's source becomes the service */
	CHECK(__sock4_xlate_rev(skb, IPPROTO_TCP, &addr, &port) == 0);
	CHECK(addr == SVC_IP && port == SVC_PORT);
	clear4();
	return 0;
}

SEC("tc")
int test_fwd_wrong_protocol_is_not_the_service(struct __sk_buff *skb)
{
	__be32 addr = SVC_IP;
	__be16 port = SVC_PORT;

	clear4();
	put_backend4(1, 1, BE1_IP);
	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_UDP, &addr, &port) == -LB_NOT_SERVICE);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_ICMP, &addr, &port) == -LB_NOT_SERVICE);
	clear4();
	return 0;
}

SEC("tc")
int test_fwd_refuses_without_backends(struct __sk_buff *skb)
{
	__be32 addr = SVC_IP;
	__be16 port = SVC_PORT;

	clear4();
	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 0, LB_SVC_CLUSTER_IP);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == -ECONNREFUSED);
	CHECK(addr == SVC_IP);
	clear4();
	return 0;
}

SEC("tc")
int test_fwd_refuses_unknown_port_of_a_service_address(struct __sk_buff *skb)
{
	__be32 addr = SVC_IP;
	__be16 port = bpf_htons(81);

	clear4();
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == -LB_NOT_SERVICE);
	put_master4(SVC_IP, 0, LB_PROTO_ANY, 0, LB_SVC_WILDCARD);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == -ECONNREFUSED);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_UDP, &addr, &port) == -ECONNREFUSED);
	clear4();
	return 0;
}

SEC("tc")
int test_fwd_refuses_when_slot_names_missing_backend(struct __sk_buff *skb)
{
	struct lb4_key key = { .address = SVC_IP, .dport = SVC_PORT, .proto = IPPROTO_TCP, .backend_slot = 1 };
	struct lb_service slot = { .backend_id = 99 };
	__be32 addr = SVC_IP;
	__be16 port = SVC_PORT;

	clear4();
	bpf_map_update_elem(&lb4_services, &key, &slot, BPF_ANY);
	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == -ECONNREFUSED);
	clear4();
	return 0;
}

/*
 * One random pick among two active backends: returns 1 or 2 for the backend
 * chosen (not a test_ program: the harness runs it many times and checks
 * that both are chosen).
 */
SEC("tc")
int pick_one_of_two(struct __sk_buff *skb)
{
	__be32 addr = SVC_IP;
	__be16 port = SVC_PORT;

	put_backend4(1, 1, BE1_IP);
	put_backend4(2, 2, BE2_IP);
	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 2, LB_SVC_CLUSTER_IP);
	if (__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port))
		return 1000 + __LINE__;
	return addr == BE1_IP ? 1 : addr == BE2_IP ? 2 : 2000 + __LINE__;
}

SEC("tc")
int test_rev_removes_stale_entry(struct __sk_buff *skb)
{
	__be32 addr = SVC_IP;
	__be16 port = SVC_PORT;

	clear4();
	put_backend4(1, 1, BE1_IP);
	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == 0);
	clear4(); /* the service goes away */
	CHECK(__sock4_xlate_rev(skb, IPPROTO_TCP, &addr, &port) == -ENOENT);
	CHECK(addr == BE1_IP && port == BE_PORT);
	CHECK(!peer4_of(skb)); /* the stale slot was freed */
	return 0;
}

/*
 * Rev-NAT ids are 32 bits: an id above 0xffff is recorded whole, and the
 * service re-created under the id it would truncate to makes the entry stale.
 */
SEC("tc")
int test_wide_revnat_id_is_recorded_whole(struct __sk_buff *skb)
{
	struct lb4_sock_peer *peer;
	__be32 addr = SVC_IP;
	__be16 port = SVC_PORT;

	clear4();
	put_backend4(1, 1, BE1_IP);
	put_master4_id(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP, 0, 0, WIDE_REVNAT);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == 0);
	peer = peer4_of(skb);
	CHECK(peer && peer->rev_nat_index == WIDE_REVNAT);
	CHECK(__sock4_xlate_rev(skb, IPPROTO_TCP, &addr, &port) == 0);
	CHECK(addr == SVC_IP && port == SVC_PORT);

	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP); /* now REVNAT */
	addr = BE1_IP;
	port = BE_PORT;
	CHECK(__sock4_xlate_rev(skb, IPPROTO_TCP, &addr, &port) == -ENOENT);
	CHECK(addr == BE1_IP && port == BE_PORT);
	CHECK(!peer4_of(skb));
	clear4();
	return 0;
}

SEC("tc")
int test_fwd6_translates(struct __sk_buff *skb)
{
	struct lb6_key key = { .dport = SVC_PORT, .proto = IPPROTO_UDP };
	struct lb_service master = { .count = 1, .rev_nat_index = REVNAT, .type = LB_SVC_CLUSTER_IP };
	struct lb_service slot = { .backend_id = 3 };
	struct lb6_backend be = { .port = BE_PORT, .proto = IPPROTO_UDP };
	__be32 addr[4] = { bpf_htonl(0xfd000096), 0, 0, bpf_htonl(0x10) };
	__be16 port = SVC_PORT;
	__u32 id = 3;

	be.address[0] = bpf_htonl(0xfd000244);
	be.address[3] = bpf_htonl(2);
	ip6_copy(key.address, addr);
	bpf_map_update_elem(&lb6_backends, &id, &be, BPF_ANY);
	key.backend_slot = 1;
	bpf_map_update_elem(&lb6_services, &key, &slot, BPF_ANY);
	key.backend_slot = 0;
	bpf_map_update_elem(&lb6_services, &key, &master, BPF_ANY);

	CHECK(__sock6_xlate_fwd(skb, IPPROTO_UDP, addr, &port) == 0);
	CHECK(addr[0] == bpf_htonl(0xfd000244) && addr[3] == bpf_htonl(2) && port == BE_PORT);
	CHECK(__sock6_xlate_rev(skb, IPPROTO_UDP, addr, &port) == 0);
	CHECK(addr[0] == bpf_htonl(0xfd000096) && addr[3] == bpf_htonl(0x10) && port == SVC_PORT);

	bpf_map_delete_elem(&lb6_services, &key);
	key.backend_slot = 1;
	bpf_map_delete_elem(&lb6_services, &key);
	bpf_map_delete_elem(&lb6_backends, &id);
	return 0;
}

/* Session affinity: one pick per client, kept while fresh and still in place. */
static __always_inline int fwd_once(struct __sk_buff *skb, __be32 *addr)
{
	__be16 port = SVC_PORT;

	*addr = SVC_IP;
	return __sock4_xlate_fwd(skb, IPPROTO_TCP, addr, &port);
}

SEC("tc")
int test_affinity_keeps_a_client_on_its_backend(struct __sk_buff *skb)
{
	struct lb_affinity_key akey = { .netns_cookie = 41, .rev_nat_index = REVNAT, .family = 4 };
	struct lb_affinity_val *aval;
	__be32 first, again;

	clear4();
	bpf_map_delete_elem(&lb_affinity, &akey);
	put_backend4(1, 1, BE1_IP);
	put_backend4(2, 2, BE2_IP);
	/*
	 * A timeout of 1 s: an entry last used at 0 (below) is expired however
	 * long the machine has been up (the clock counts from boot: with 100 s,
	 * a guest up for less never saw it expire).
	 */
	put_master4_flags(SVC_IP, SVC_PORT, IPPROTO_TCP, 2, LB_SVC_CLUSTER_IP, LB_SVC_F_AFFINITY, 1);
	test_netns_cookie = 41;
	CHECK(fwd_once(skb, &first) == 0);
	aval = bpf_map_lookup_elem(&lb_affinity, &akey);
	CHECK(aval && aval->backend_id == (first == BE1_IP ? 1 : 2) && aval->slot == aval->backend_id);
	CHECK(fwd_once(skb, &again) == 0 && again == first);
	CHECK(fwd_once(skb, &again) == 0 && again == first);
	CHECK(fwd_once(skb, &again) == 0 && again == first);
	CHECK(fwd_once(skb, &again) == 0 && again == first);
	CHECK(fwd_once(skb, &again) == 0 && again == first);

	/* an expired entry is replaced by a fresh pick */
	aval = bpf_map_lookup_elem(&lb_affinity, &akey);
	CHECK(aval);
	aval->last_used = 0;
	{
		__u32 hit = LB_MTR_AFFINITY_HIT;
		__u64 *n = bpf_map_lookup_elem(&lb_metrics, &hit);
		__u64 before = n ? *n : 0;

		CHECK(fwd_once(skb, &again) == 0);
		n = bpf_map_lookup_elem(&lb_metrics, &hit);
		CHECK(n && *n == before); /* not a hit: the expired entry was not used (this CPU's counter) */
	}
	aval = bpf_map_lookup_elem(&lb_affinity, &akey);
	CHECK(aval && aval->last_used > 0);

	/* its backend moved out of the slot: re-pick, and remember the new one */
	put_backend4(aval->slot, 7, bpf_htonl(0x0af40109));
	CHECK(fwd_once(skb, &again) == 0);
	aval = bpf_map_lookup_elem(&lb_affinity, &akey);
	CHECK(aval);
	{
		struct lb4_key k = { .address = SVC_IP, .dport = SVC_PORT, .proto = IPPROTO_TCP,
				     .backend_slot = aval->slot };
		struct lb_service *slot = bpf_map_lookup_elem(&lb4_services, &k);

		CHECK(slot && slot->backend_id == aval->backend_id);
	}
	test_netns_cookie = 1;
	bpf_map_delete_elem(&lb_affinity, &akey);
	clear4();
	return 0;
}

SEC("tc")
int test_no_affinity_entry_without_the_flag(struct __sk_buff *skb)
{
	struct lb_affinity_key akey = { .netns_cookie = 42, .rev_nat_index = REVNAT, .family = 4 };
	__be32 addr;

	clear4();
	bpf_map_delete_elem(&lb_affinity, &akey);
	put_backend4(1, 1, BE1_IP);
	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP);
	test_netns_cookie = 42;
	CHECK(fwd_once(skb, &addr) == 0 && addr == BE1_IP);
	CHECK(!bpf_map_lookup_elem(&lb_affinity, &akey));
	test_netns_cookie = 1;
	clear4();
	return 0;
}

/* The affinity entry is keyed by the whole 32-bit rev-NAT id. */
SEC("tc")
int test_affinity_keyed_by_wide_revnat_id(struct __sk_buff *skb)
{
	struct lb_affinity_key wide = { .netns_cookie = 43, .rev_nat_index = WIDE_REVNAT, .family = 4 };
	struct lb_affinity_key narrow = { .netns_cookie = 43, .rev_nat_index = REVNAT, .family = 4 };
	struct lb_affinity_val *aval;
	__be32 addr;

	clear4();
	bpf_map_delete_elem(&lb_affinity, &wide);
	bpf_map_delete_elem(&lb_affinity, &narrow);
	put_backend4(1, 1, BE1_IP);
	put_master4_id(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP, LB_SVC_F_AFFINITY, 100, WIDE_REVNAT);
	test_netns_cookie = 43;
	CHECK(fwd_once(skb, &addr) == 0 && addr == BE1_IP);
	aval = bpf_map_lookup_elem(&lb_affinity, &wide);
	CHECK(aval && aval->backend_id == 1 && aval->slot == 1);
	CHECK(!bpf_map_lookup_elem(&lb_affinity, &narrow));
	test_netns_cookie = 1;
	bpf_map_delete_elem(&lb_affinity, &wide);
	clear4();
	return 0;
}

/*
 * A UDP socket's rev-NAT entry is written only when missing or different. A
 * hash map update always puts a new element in place of the old one, so
 * "not rewritten" shows as the same element (the same value pointer) before
 * and after; a rewrite gives another element.
 */
#define SVC2_IP		bpf_htonl(0x0a60000b)	/* 10.96.0.11, also served by BE1 */
#define DNS_PORT	bpf_htons(53)
#define REVNAT2		8

/* A UDP service on port 53 whose only slot names backend 1 (BE1). */
static __always_inline void put_udp_svc(__be32 addr, __u32 rev_nat_index)
{
	struct lb4_key key = { .address = addr, .dport = DNS_PORT, .proto = IPPROTO_UDP, .backend_slot = 1 };
	struct lb_service slot = { .backend_id = 1 };

	bpf_map_update_elem(&lb4_services, &key, &slot, BPF_ANY);
	put_master4_id(addr, DNS_PORT, IPPROTO_UDP, 1, LB_SVC_CLUSTER_IP, 0, 0, rev_nat_index);
}

static __always_inline void clear_udp_svc(__be32 addr)
{
	struct lb4_key key = { .address = addr, .dport = DNS_PORT, .proto = IPPROTO_UDP };

	bpf_map_delete_elem(&lb4_services, &key);
	key.backend_slot = 1;
	bpf_map_delete_elem(&lb4_services, &key);
}

/* One datagram (or UDP connect) to the service `svc`:53. */
static __always_inline int udp_to(struct __sk_buff *skb, __be32 svc)
{
	__be32 addr = svc;
	__be16 port = DNS_PORT;

	return __sock4_xlate_fwd(skb, IPPROTO_UDP, &addr, &port);
}

SEC("tc")
int test_revnat_created_when_missing(struct __sk_buff *skb)
{
	struct lb4_sock_key skey = { .cookie = bpf_get_socket_cookie(skb), .address = BE1_IP, .port = BE_PORT };
	struct lb4_sock_revnat *rev;

	clear4();
	bpf_map_delete_elem(&lb4_sock_revnat, &skey);
	put_backend4(1, 1, BE1_IP);
	put_udp_svc(SVC_IP, REVNAT);
	CHECK(!bpf_map_lookup_elem(&lb4_sock_revnat, &skey));
	CHECK(udp_to(skb, SVC_IP) == 0);
	rev = bpf_map_lookup_elem(&lb4_sock_revnat, &skey);
	CHECK(rev && rev->address == SVC_IP && rev->port == DNS_PORT && rev->rev_nat_index == REVNAT);
	bpf_map_delete_elem(&lb4_sock_revnat, &skey);
	clear_udp_svc(SVC_IP);
	clear4();
	return 0;
}

SEC("tc")
int test_revnat_identical_entry_not_rewritten(struct __sk_buff *skb)
{
	struct lb4_sock_key skey = { .cookie = bpf_get_socket_cookie(skb), .address = BE1_IP, .port = BE_PORT };
	struct lb4_sock_revnat seed = { .address = SVC_IP, .port = DNS_PORT, .rev_nat_index = REVNAT };
	struct lb4_sock_revnat *before, *after;

	clear4();
	put_backend4(1, 1, BE1_IP);
	put_udp_svc(SVC_IP, REVNAT);

	/* an entry already there (as the last datagram to this backend left it) */
	bpf_map_update_elem(&lb4_sock_revnat, &skey, &seed, BPF_ANY);
	before = bpf_map_lookup_elem(&lb4_sock_revnat, &skey);
	CHECK(before);
	CHECK(udp_to(skb, SVC_IP) == 0);
	after = bpf_map_lookup_elem(&lb4_sock_revnat, &skey);
	CHECK(after == before);

	/* and again: later datagrams of the socket leave the first one's entry */
	CHECK(udp_to(skb, SVC_IP) == 0);
	CHECK(udp_to(skb, SVC_IP) == 0);
	after = bpf_map_lookup_elem(&lb4_sock_revnat, &skey);
	CHECK(after == before);
	CHECK(after->address == SVC_IP && after->port == DNS_PORT && after->rev_nat_index == REVNAT);
	bpf_map_delete_elem(&lb4_sock_revnat, &skey);
	clear_udp_svc(SVC_IP);
	clear4();
	return 0;
}

/* The same socket sent to the same backend through another service: the entry follows. */
SEC("tc")
int test_revnat_rewritten_when_it_differs(struct __sk_buff *skb)
{
	struct lb4_sock_key skey = { .cookie = bpf_get_socket_cookie(skb), .address = BE1_IP, .port = BE_PORT };
	struct lb4_sock_revnat *before, *after;

	clear4();
	put_backend4(1, 1, BE1_IP);
	put_udp_svc(SVC_IP, REVNAT);
	put_udp_svc(SVC2_IP, REVNAT2);
	bpf_map_delete_elem(&lb4_sock_revnat, &skey);

	CHECK(udp_to(skb, SVC_IP) == 0);
	before = bpf_map_lookup_elem(&lb4_sock_revnat, &skey);
	CHECK(before && before->address == SVC_IP && before->rev_nat_index == REVNAT);

	/* re-connected to the other service */
	CHECK(udp_to(skb, SVC2_IP) == 0);
	after = bpf_map_lookup_elem(&lb4_sock_revnat, &skey);
	CHECK(after && after->address == SVC2_IP && after->port == DNS_PORT && after->rev_nat_index == REVNAT2);

	/* the same service deleted and re-created under a new rev-NAT id */
	put_udp_svc(SVC2_IP, WIDE_REVNAT);
	CHECK(udp_to(skb, SVC2_IP) == 0);
	after = bpf_map_lookup_elem(&lb4_sock_revnat, &skey);
	CHECK(after && after->address == SVC2_IP && after->rev_nat_index == WIDE_REVNAT);

	/* and a reply is reported from the service the socket asked for last */
	{
		__be32 addr = BE1_IP;
		__be16 port = BE_PORT;

		CHECK(__sock4_xlate_rev(skb, IPPROTO_UDP, &addr, &port) == 0);
		CHECK(addr == SVC2_IP && port == DNS_PORT);
	}
	bpf_map_delete_elem(&lb4_sock_revnat, &skey);
	clear_udp_svc(SVC2_IP);
	clear_udp_svc(SVC_IP);
	clear4();
	return 0;
}

/* TCP: a connect again (after a failed one) overwrites the socket's slot, and right. */
SEC("tc")
int test_revnat_tcp_written_on_connect(struct __sk_buff *skb)
{
	__u64 cookie = bpf_get_socket_cookie(skb);
	struct lb4_sock_peer *peer = (struct lb4_sock_peer *)sock_peer_claim(&lb4_sock_peer, cookie);
	__be32 addr = SVC_IP;
	__be16 port = SVC_PORT;

	CHECK(peer);
	peer->cookie = cookie;
	peer->backend = BE2_IP;
	peer->backend_port = BE_PORT;
	peer->address = SVC2_IP;
	peer->rev_nat_index = REVNAT2;
	clear4();
	put_backend4(1, 1, BE1_IP);
	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == 0);
	CHECK(peer4_of(skb) == peer);
	CHECK(peer->backend == BE1_IP && peer->address == SVC_IP && peer->port == SVC_PORT &&
	      peer->rev_nat_index == REVNAT);
	peer->cookie = 0;
	clear4();
	return 0;
}

/*
 * The slots: a socket takes its first slot when free, its second when the
 * first holds a live socket, and when both do, the older socket's (smaller
 * cookie) is taken over. Cookies chosen so the first slots meet.
 */
SEC("tc")
int test_sock_peer_slots(struct __sk_buff *skb)
{
	__u64 c1 = 0x100000005ULL, c2 = c1 + LB_SOCK_PEER_SLOTS, c3 = c2 + LB_SOCK_PEER_SLOTS;
	__u64 *p1, *p2, *p3, *q;

	CHECK(sock_peer_slot(c1, 0) == sock_peer_slot(c2, 0));
	CHECK(sock_peer_slot(c2, 1) != sock_peer_slot(c2, 0));
	p1 = sock_peer_claim(&lb4_sock_peer, c1);
	CHECK(p1 && !*p1);
	*p1 = c1;
	CHECK(sock_peer_find(&lb4_sock_peer, c1) == p1);
	CHECK(sock_peer_claim(&lb4_sock_peer, c1) == p1); /* its own again */
	p2 = sock_peer_claim(&lb4_sock_peer, c2);
	CHECK(p2 && p2 != p1);
	*p2 = c2;
	CHECK(sock_peer_find(&lb4_sock_peer, c1) == p1 && sock_peer_find(&lb4_sock_peer, c2) == p2);
	/* c3's first slot is c1's and, unless its second meets c2's, that is free */
	p3 = sock_peer_claim(&lb4_sock_peer, c3);
	CHECK(p3 && p3 != p1);
	q = p3;
	if (*q == 0) {
		/* occupy it, then a fourth socket meeting c1 and c3 evicts the older, c1 */
		*q = c3;
		if (sock_peer_slot(c3 + LB_SOCK_PEER_SLOTS, 1) == sock_peer_slot(c3, 1)) {
			CHECK(sock_peer_claim(&lb4_sock_peer, c3 + LB_SOCK_PEER_SLOTS) == p1);
		}
	}
	*p1 = 0;
	*p2 = 0;
	*p3 = 0;
	CHECK(!sock_peer_find(&lb4_sock_peer, c1) && !sock_peer_find(&lb4_sock_peer, c2));
	return 0;
}

SEC("tc")
int test_revnat6_identical_entry_not_rewritten(struct __sk_buff *skb)
{
	struct lb6_key key = { .address = { bpf_htonl(0xfd000096), 0, 0, bpf_htonl(0x11) }, .dport = SVC_PORT,
			       .proto = IPPROTO_UDP };
	struct lb_service master = { .count = 1, .rev_nat_index = REVNAT, .type = LB_SVC_CLUSTER_IP };
	struct lb_service slot = { .backend_id = 4 };
	struct lb6_backend be = { .address = { bpf_htonl(0xfd000244), 0, 0, bpf_htonl(3) }, .port = BE_PORT,
				  .proto = IPPROTO_UDP };
	struct lb6_sock_key skey = { .cookie = bpf_get_socket_cookie(skb), .port = BE_PORT };
	struct lb6_sock_revnat *before, *after;
	__be32 addr[4];
	__be16 port;
	__u32 id = 4;

	ip6_copy(skey.address, be.address);
	bpf_map_delete_elem(&lb6_sock_revnat, &skey);
	bpf_map_update_elem(&lb6_backends, &id, &be, BPF_ANY);
	key.backend_slot = 1;
	bpf_map_update_elem(&lb6_services, &key, &slot, BPF_ANY);
	key.backend_slot = 0;
	bpf_map_update_elem(&lb6_services, &key, &master, BPF_ANY);

	ip6_copy(addr, key.address);
	port = SVC_PORT;
	CHECK(__sock6_xlate_fwd(skb, IPPROTO_UDP, addr, &port) == 0);
	before = bpf_map_lookup_elem(&lb6_sock_revnat, &skey);
	CHECK(before && before->address[3] == bpf_htonl(0x11) && before->rev_nat_index == REVNAT);

	ip6_copy(addr, key.address);
	port = SVC_PORT;
	CHECK(__sock6_xlate_fwd(skb, IPPROTO_UDP, addr, &port) == 0);
	after = bpf_map_lookup_elem(&lb6_sock_revnat, &skey);
	CHECK(after == before);

	/* a different value (re-created under another id) is rewritten */
	master.rev_nat_index = REVNAT2;
	bpf_map_update_elem(&lb6_services, &key, &master, BPF_ANY);
	ip6_copy(addr, key.address);
	port = SVC_PORT;
	CHECK(__sock6_xlate_fwd(skb, IPPROTO_UDP, addr, &port) == 0);
	after = bpf_map_lookup_elem(&lb6_sock_revnat, &skey);
	CHECK(after && after->rev_nat_index == REVNAT2);

	bpf_map_delete_elem(&lb6_sock_revnat, &skey);
	bpf_map_delete_elem(&lb6_services, &key);
	key.backend_slot = 1;
	bpf_map_delete_elem(&lb6_services, &key);
	bpf_map_delete_elem(&lb6_backends, &id);
	return 0;
}

/* ------------------------------------------- scopes and NodePort surrogate */

#define NODE_IP		bpf_htonl(0x0afa0001)	/* 10.250.0.1, a node address */
#define OTHER_IP	bpf_htonl(0x0afa0063)	/* 10.250.0.99, not one */
#define LB_IP		bpf_htonl(0x0afa0902)	/* 10.250.9.2, a LoadBalancer IP */
#define LOOPBACK	bpf_htonl(0x7f000001)
#define NODEPORT	bpf_htons(30080)
#define NP_REVNAT	21
#define NP_INT_REVNAT	22
#define BE3_IP		bpf_htonl(0x0afc0202)	/* 10.252.2.2, a remote backend */

/* A master entry at `key` (slot 0), and slots 1..count naming backend ids first_id... */
static __always_inline void put_frontend4(struct lb4_key key, __u16 count, __u32 first_id, __u8 type, __u8 flags,
					  __u32 rev_nat_index)
{
	struct lb_service svc = { .count = count, .rev_nat_index = rev_nat_index, .type = type, .flags = flags };
	struct lb_service slot = {};

	for (__u16 i = 1; i <= 2; i++) {
		if (i > count)
			break;
		key.backend_slot = i;
		slot.backend_id = first_id + i - 1;
		bpf_map_update_elem(&lb4_services, &key, &slot, BPF_ANY);
	}
	key.backend_slot = 0;
	bpf_map_update_elem(&lb4_services, &key, &svc, BPF_ANY);
}

static __always_inline void del_frontend4(struct lb4_key key)
{
	for (__u16 i = 0; i <= 2; i++) {
		key.backend_slot = i;
		bpf_map_delete_elem(&lb4_services, &key);
	}
}

static __always_inline void put_be4(__u32 id, __be32 addr)
{
	struct lb4_backend be = { .address = addr, .port = BE_PORT, .proto = IPPROTO_TCP };

	bpf_map_update_elem(&lb4_backends, &id, &be, BPF_ANY);
}

static __always_inline void node_addr4(__be32 addr, bool add)
{
	struct lb_node_addr_key k = { .address = { addr }, .family = 4 };
	struct lb_node_addr v = { .ifindex = 1 };

	if (add)
		bpf_map_update_elem(&lb_node_addrs, &k, &v, BPF_ANY);
	else
		bpf_map_delete_elem(&lb_node_addrs, &k);
}

#define SURROGATE4	((struct lb4_key){ .dport = NODEPORT, .proto = IPPROTO_TCP })
#define SURROGATE4_INT	((struct lb4_key){ .dport = NODEPORT, .proto = IPPROTO_TCP, .scope = LB_SCOPE_INT })

/* The NodePort 30080/TCP surrogate with backend 1 (BE1), and this node's address. */
static __always_inline void np4_setup(void)
{
	put_be4(1, BE1_IP);
	put_be4(2, BE3_IP);
	put_frontend4(SURROGATE4, 1, 1, LB_SVC_NODEPORT, 0, NP_REVNAT);
	node_addr4(NODE_IP, true);
}

static __always_inline void np4_clear(void)
{
	__u32 id1 = 1, id2 = 2;

	del_frontend4(SURROGATE4);
	del_frontend4(SURROGATE4_INT);
	node_addr4(NODE_IP, false);
	bpf_map_delete_elem(&lb4_backends, &id1);
	bpf_map_delete_elem(&lb4_backends, &id2);
}

/* One connect to dst:30080/TCP: 0 and the backend chosen, or -errno. */
static __always_inline int np4_connect(struct __sk_buff *skb, __be32 dst, __be32 *to)
{
	__be16 port = NODEPORT;

	*to = dst;
	return __sock4_xlate_fwd(skb, IPPROTO_TCP, to, &port);
}

/* The socket's rev-NAT entry for backend `be` says the address it dialled. */
static __always_inline bool revnat4_says(struct __sk_buff *skb, __be32 be, __be32 svc, __u32 id)
{
	struct lb4_sock_peer *p = peer4_of(skb);

	return p && p->backend == be && p->backend_port == BE_PORT && p->address == svc && p->port == NODEPORT &&
	       p->rev_nat_index == id;
}

/* recvmsg/getpeername for a socket sent to backend `be`: 0 and the address reported, or -errno. */
static __always_inline int rev4(struct __sk_buff *skb, __be32 be, __be32 *out)
{
	__be16 port = BE_PORT;
	int err;

	*out = be;
	err = __sock4_xlate_rev(skb, IPPROTO_TCP, out, &port);
	if (!err && port != NODEPORT)
		return -EINVAL;
	return err;
}

SEC("tc")
int test_nodeport_on_a_node_address(struct __sk_buff *skb)
{
	__be32 to, back;

	np4_clear();
	np4_setup();
	CHECK(np4_connect(skb, NODE_IP, &to) == 0 && to == BE1_IP);
	/* replies and getpeername say the node address dialled, not 0.0.0.0 */
	CHECK(revnat4_says(skb, BE1_IP, NODE_IP, NP_REVNAT));
	CHECK(rev4(skb, BE1_IP, &back) == 0 && back == NODE_IP);
	/* the address stops being the node's: new sockets are no longer balanced */
	node_addr4(NODE_IP, false);
	CHECK(np4_connect(skb, NODE_IP, &to) == -LB_NOT_SERVICE && to == NODE_IP);
	np4_clear();
	return 0;
}

SEC("tc")
int test_nodeport_on_loopback(struct __sk_buff *skb)
{
	__be32 to, back;

	np4_clear();
	np4_setup();
	CHECK(np4_connect(skb, LOOPBACK, &to) == 0 && to == BE1_IP);
	CHECK(revnat4_says(skb, BE1_IP, LOOPBACK, NP_REVNAT));
	CHECK(rev4(skb, BE1_IP, &back) == 0 && back == LOOPBACK);
	/* all of 127.0.0.0/8 is loopback */
	CHECK(np4_connect(skb, bpf_htonl(0x7f000102), &to) == 0 && to == BE1_IP);
	np4_clear();
	return 0;
}

/* connect() to 0.0.0.0 is a connect to the local host (the kernel routes it to loopback). */
SEC("tc")
int test_nodeport_on_the_any_address(struct __sk_buff *skb)
{
	__be32 to, back;

	np4_clear();
	np4_setup();
	CHECK(np4_connect(skb, 0, &to) == 0 && to == BE1_IP);
	CHECK(revnat4_says(skb, BE1_IP, LOOPBACK, NP_REVNAT));
	CHECK(rev4(skb, BE1_IP, &back) == 0 && back == LOOPBACK);
	np4_clear();
	return 0;
}

SEC("tc")
int test_no_surrogate_for_other_addresses(struct __sk_buff *skb)
{
	struct lb4_key np_udp = { .dport = NODEPORT, .proto = IPPROTO_UDP };
	__be32 to;
	__be16 port = NODEPORT;

	np4_clear();
	np4_setup();
	/* an address that is not the node's, on the nodePort */
	CHECK(np4_connect(skb, OTHER_IP, &to) == -LB_NOT_SERVICE && to == OTHER_IP);
	/* the node address, on another port or protocol */
	to = NODE_IP;
	port = bpf_htons(30081);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &to, &port) == -LB_NOT_SERVICE && to == NODE_IP);
	to = NODE_IP;
	port = NODEPORT;
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_UDP, &to, &port) == -LB_NOT_SERVICE && to == NODE_IP);
	/* an entry at 0.0.0.0 that is no NodePort is no surrogate */
	put_frontend4(np_udp, 1, 1, LB_SVC_CLUSTER_IP, 0, NP_REVNAT);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_UDP, &to, &port) == -LB_NOT_SERVICE && to == NODE_IP);
	del_frontend4(np_udp);
	np4_clear();
	return 0;
}

/* A surrogate without a selectable backend is refused, as any frontend is. */
SEC("tc")
int test_nodeport_without_backends_is_refused(struct __sk_buff *skb)
{
	__be32 to;

	np4_clear();
	node_addr4(NODE_IP, true);
	put_frontend4(SURROGATE4, 0, 1, LB_SVC_NODEPORT, 0, NP_REVNAT);
	CHECK(np4_connect(skb, NODE_IP, &to) == -ECONNREFUSED && to == NODE_IP);
	CHECK(np4_connect(skb, LOOPBACK, &to) == -ECONNREFUSED);
	np4_clear();
	return 0;
}

/* The surrogate deleted (or re-created): the socket's entry is stale and removed. */
SEC("tc")
int test_nodeport_revnat_stale_when_the_service_goes(struct __sk_buff *skb)
{
	__be32 to, back;

	np4_clear();
	np4_setup();
	CHECK(np4_connect(skb, NODE_IP, &to) == 0 && to == BE1_IP);
	put_frontend4(SURROGATE4, 1, 1, LB_SVC_NODEPORT, 0, NP_REVNAT + 100);
	CHECK(rev4(skb, BE1_IP, &back) == -ENOENT && back == BE1_IP);
	CHECK(!revnat4_says(skb, BE1_IP, NODE_IP, NP_REVNAT));
	np4_clear();
	return 0;
}

/*
 * externalTrafficPolicy Local: the external entry holds the local backend
 * (BE1), the internal twin the cluster's (BE3). Sockets get the twin.
 */
SEC("tc")
int test_two_scopes_nodeport_serves_the_internal_twin(struct __sk_buff *skb)
{
	__be32 to, back;

	np4_clear();
	np4_setup();
	put_frontend4(SURROGATE4, 1, 1, LB_SVC_NODEPORT, LB_SVC_F_LOCAL_EXTERNAL | LB_SVC_F_TWO_SCOPES, NP_REVNAT);
	put_frontend4(SURROGATE4_INT, 1, 2, LB_SVC_NODEPORT, 0, NP_INT_REVNAT);
	CHECK(np4_connect(skb, NODE_IP, &to) == 0 && to == BE3_IP);
	CHECK(revnat4_says(skb, BE3_IP, NODE_IP, NP_INT_REVNAT));
	/* the twin's rev-NAT id is live through the external entry's flag */
	CHECK(rev4(skb, BE3_IP, &back) == 0 && back == NODE_IP);

	/* the twin without a selectable backend: refused, though the external entry has one */
	put_frontend4(SURROGATE4_INT, 0, 2, LB_SVC_NODEPORT, 0, NP_INT_REVNAT);
	CHECK(np4_connect(skb, NODE_IP, &to) == -ECONNREFUSED);

	/* the twin not written yet (or already removed): the external entry serves */
	del_frontend4(SURROGATE4_INT);
	CHECK(np4_connect(skb, LOOPBACK, &to) == 0 && to == BE1_IP);

	/* without the flag the twin is never read */
	put_frontend4(SURROGATE4_INT, 1, 2, LB_SVC_NODEPORT, 0, NP_INT_REVNAT);
	put_frontend4(SURROGATE4, 1, 1, LB_SVC_NODEPORT, 0, NP_REVNAT);
	CHECK(np4_connect(skb, NODE_IP, &to) == 0 && to == BE1_IP);
	/* and a twin's rev-NAT id is stale then */
	CHECK(rev4(skb, BE3_IP, &back) == -ENOENT);
	np4_clear();
	return 0;
}

/* The same for a LoadBalancer IP, dialled directly (no surrogate involved). */
SEC("tc")
int test_two_scopes_loadbalancer_ip(struct __sk_buff *skb)
{
	struct lb4_key ext = { .address = LB_IP, .dport = SVC_PORT, .proto = IPPROTO_TCP };
	struct lb4_key in = { .address = LB_IP, .dport = SVC_PORT, .proto = IPPROTO_TCP, .scope = LB_SCOPE_INT };
	__be32 addr = LB_IP;
	__be16 port = SVC_PORT;

	put_be4(1, BE1_IP);
	put_be4(2, BE3_IP);
	put_frontend4(ext, 1, 1, LB_SVC_LOADBALANCER, LB_SVC_F_LOCAL_EXTERNAL | LB_SVC_F_TWO_SCOPES, NP_REVNAT);
	put_frontend4(in, 1, 2, LB_SVC_LOADBALANCER, 0, NP_INT_REVNAT);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == 0 && addr == BE3_IP && port == BE_PORT);
	CHECK(__sock4_xlate_rev(skb, IPPROTO_TCP, &addr, &port) == 0 && addr == LB_IP && port == SVC_PORT);
	/* an external IP or LoadBalancer IP without two scopes is balanced as a cluster IP is */
	put_frontend4(ext, 1, 1, LB_SVC_EXTERNAL_IP, 0, NP_REVNAT);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == 0 && addr == BE1_IP);
	del_frontend4(ext);
	del_frontend4(in);
	np4_clear();
	return 0;
}

/* ::ffff:<node> and ::ffff:127.0.0.1 on an IPv6 socket take the IPv4 path, both ways. */
SEC("tc")
int test_nodeport_v4mapped(struct __sk_buff *skb)
{
	__be32 a[4] = { 0, 0, bpf_htonl(0x0000ffff), NODE_IP };
	__be16 port = NODEPORT;

	np4_clear();
	np4_setup();
	CHECK(__sock6_fwd(skb, IPPROTO_TCP, a, &port) == 0);
	CHECK(ip6_is_v4mapped(a) && a[3] == BE1_IP && port == BE_PORT);
	CHECK(revnat4_says(skb, BE1_IP, NODE_IP, NP_REVNAT));
	CHECK(__sock6_rev(skb, IPPROTO_TCP, a, &port) == 0);
	CHECK(ip6_is_v4mapped(a) && a[3] == NODE_IP && port == NODEPORT);

	a[3] = LOOPBACK;
	CHECK(__sock6_fwd(skb, IPPROTO_TCP, a, &port) == 0 && a[3] == BE1_IP);
	CHECK(__sock6_rev(skb, IPPROTO_TCP, a, &port) == 0 && ip6_is_v4mapped(a) && a[3] == LOOPBACK);

	a[3] = OTHER_IP;
	port = NODEPORT;
	CHECK(__sock6_fwd(skb, IPPROTO_TCP, a, &port) == -LB_NOT_SERVICE && a[3] == OTHER_IP);
	np4_clear();
	return 0;
}

/* IPv6: the surrogate at :: answers on ::1, the node's IPv6 addresses and :: itself. */
#define NODE6_0		bpf_htonl(0xfd000250)	/* fd00:250::1 */
#define BE6_0		bpf_htonl(0xfd000252)	/* fd00:252:1::2 */

SEC("tc")
int test_nodeport6(struct __sk_buff *skb)
{
	struct lb6_key np = { .dport = NODEPORT, .proto = IPPROTO_TCP };
	struct lb_service master = { .count = 1, .rev_nat_index = NP_REVNAT, .type = LB_SVC_NODEPORT };
	struct lb_service slot = { .backend_id = 5 };
	struct lb6_backend be = { .address = { BE6_0, bpf_htonl(0x00010000), 0, bpf_htonl(2) }, .port = BE_PORT,
				  .proto = IPPROTO_TCP };
	struct lb_node_addr_key nk = { .address = { NODE6_0, 0, 0, bpf_htonl(1) }, .family = 6 };
	struct lb_node_addr nv = { .ifindex = 1 };
	__be32 node[4] = { NODE6_0, 0, 0, bpf_htonl(1) };
	__be32 other[4] = { NODE6_0, 0, 0, bpf_htonl(0x63) };
	__be32 lo[4] = { 0, 0, 0, bpf_htonl(1) };
	__be32 any[4] = {};
	__be32 a[4];
	__be16 port;
	__u32 id = 5;

	bpf_map_update_elem(&lb6_backends, &id, &be, BPF_ANY);
	np.backend_slot = 1;
	bpf_map_update_elem(&lb6_services, &np, &slot, BPF_ANY);
	np.backend_slot = 0;
	bpf_map_update_elem(&lb6_services, &np, &master, BPF_ANY);
	bpf_map_update_elem(&lb_node_addrs, &nk, &nv, BPF_ANY);

	/* the node address, and back */
	ip6_copy(a, node);
	port = NODEPORT;
	CHECK(__sock6_fwd(skb, IPPROTO_TCP, a, &port) == 0 && a[0] == BE6_0 && a[3] == bpf_htonl(2) && port == BE_PORT);
	CHECK(__sock6_rev(skb, IPPROTO_TCP, a, &port) == 0 && a[0] == NODE6_0 && a[3] == bpf_htonl(1) && port == NODEPORT);
	/* ::1, and back */
	ip6_copy(a, lo);
	CHECK(__sock6_fwd(skb, IPPROTO_TCP, a, &port) == 0 && a[0] == BE6_0);
	CHECK(__sock6_rev(skb, IPPROTO_TCP, a, &port) == 0 && !a[0] && !a[1] && !a[2] && a[3] == bpf_htonl(1));
	/* ::, reported back as ::1 */
	ip6_copy(a, any);
	port = NODEPORT;
	CHECK(__sock6_fwd(skb, IPPROTO_TCP, a, &port) == 0 && a[0] == BE6_0);
	CHECK(__sock6_rev(skb, IPPROTO_TCP, a, &port) == 0 && !a[0] && !a[1] && !a[2] && a[3] == bpf_htonl(1));
	/* another address of the prefix is not the node's */
	ip6_copy(a, other);
	port = NODEPORT;
	CHECK(__sock6_fwd(skb, IPPROTO_TCP, a, &port) == -LB_NOT_SERVICE && a[3] == bpf_htonl(0x63));
	/* the node address no longer the node's */
	bpf_map_delete_elem(&lb_node_addrs, &nk);
	ip6_copy(a, node);
	CHECK(__sock6_fwd(skb, IPPROTO_TCP, a, &port) == -LB_NOT_SERVICE);

	bpf_map_delete_elem(&lb6_services, &np);
	np.backend_slot = 1;
	bpf_map_delete_elem(&lb6_services, &np);
	bpf_map_delete_elem(&lb6_backends, &id);
	return 0;
}

/* ------------------------------------------------------------- post_bind */

static __always_inline __u64 bind_refused(void)
{
	__u32 k = LB_MTR_BIND_REFUSED;
	__u64 *v = bpf_map_lookup_elem(&lb_metrics, &k);

	return v ? *v : 0;
}

SEC("tc")
int test_post_bind_refuses_a_nodeport(struct __sk_buff *skb)
{
	struct lb6_key np6 = { .dport = bpf_htons(30090), .proto = IPPROTO_UDP };
	struct lb_service master6 = { .count = 1, .rev_nat_index = NP_REVNAT, .type = LB_SVC_NODEPORT };
	__u64 before;

	np4_clear();
	np4_setup();
	before = bind_refused();
	CHECK(__sock_post_bind(IPPROTO_TCP, NODEPORT) == -EADDRINUSE);
	CHECK(bind_refused() == before + 1);
	/* another protocol on the same port, another port, port 0, a protocol never balanced */
	CHECK(__sock_post_bind(IPPROTO_UDP, NODEPORT) == 0);
	CHECK(__sock_post_bind(IPPROTO_TCP, bpf_htons(30081)) == 0);
	CHECK(__sock_post_bind(IPPROTO_TCP, 0) == 0);
	CHECK(__sock_post_bind(IPPROTO_SCTP, NODEPORT) == 0);
	CHECK(bind_refused() == before + 1);

	/* an IPv6-only nodePort holds the port for both families */
	CHECK(__sock_post_bind(IPPROTO_UDP, bpf_htons(30090)) == 0);
	bpf_map_update_elem(&lb6_services, &np6, &master6, BPF_ANY);
	CHECK(__sock_post_bind(IPPROTO_UDP, bpf_htons(30090)) == -EADDRINUSE);
	bpf_map_delete_elem(&lb6_services, &np6);

	/* a ClusterIP or LoadBalancer port is no nodePort: binding it is the node's business */
	np4_clear();
	put_master4(SVC_IP, NODEPORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP);
	CHECK(__sock_post_bind(IPPROTO_TCP, NODEPORT) == 0);
	clear4();
	{
		struct lb4_key k = { .address = SVC_IP, .dport = NODEPORT, .proto = IPPROTO_TCP };

		bpf_map_delete_elem(&lb4_services, &k);
	}
	CHECK(bind_refused() == before + 2);
	return 0;
}
