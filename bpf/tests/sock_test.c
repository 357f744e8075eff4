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
	struct lb4_sock_revnat *rev;
	__be32 addr = SVC_IP;
	__be16 port = SVC_PORT;

	clear4();
	put_backend4(1, 1, BE1_IP);
	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == 0);
	CHECK(addr == BE1_IP && port == BE_PORT);

	skey.cookie = bpf_get_socket_cookie(skb);
	rev = bpf_map_lookup_elem(&lb4_sock_revnat, &skey);
	CHECK(rev && rev->address == SVC_IP && rev->port == SVC_PORT && rev->rev_nat_index == REVNAT);

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
	struct lb4_sock_key skey = { .address = BE1_IP, .port = BE_PORT };
	__be32 addr = SVC_IP;
	__be16 port = SVC_PORT;

	clear4();
	put_backend4(1, 1, BE1_IP);
	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == 0);
	clear4(); /* the service goes away */
	CHECK(__sock4_xlate_rev(skb, IPPROTO_TCP, &addr, &port) == -ENOENT);
	CHECK(addr == BE1_IP && port == BE_PORT);
	skey.cookie = bpf_get_socket_cookie(skb);
	CHECK(!bpf_map_lookup_elem(&lb4_sock_revnat, &skey));
	return 0;
}

/*
 * Rev-NAT ids are 32 bits: an id above 0xffff is recorded whole, and the
 * service re-created under the id it would truncate to makes the entry stale.
 */
SEC("tc")
int test_wide_revnat_id_is_recorded_whole(struct __sk_buff *skb)
{
	struct lb4_sock_key skey = { .address = BE1_IP, .port = BE_PORT };
	struct lb4_sock_revnat *rev;
	__be32 addr = SVC_IP;
	__be16 port = SVC_PORT;

	clear4();
	put_backend4(1, 1, BE1_IP);
	put_master4_id(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP, 0, 0, WIDE_REVNAT);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == 0);
	skey.cookie = bpf_get_socket_cookie(skb);
	rev = bpf_map_lookup_elem(&lb4_sock_revnat, &skey);
	CHECK(rev && rev->rev_nat_index == WIDE_REVNAT);
	CHECK(__sock4_xlate_rev(skb, IPPROTO_TCP, &addr, &port) == 0);
	CHECK(addr == SVC_IP && port == SVC_PORT);

	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP); /* now REVNAT */
	addr = BE1_IP;
	port = BE_PORT;
	CHECK(__sock4_xlate_rev(skb, IPPROTO_TCP, &addr, &port) == -ENOENT);
	CHECK(addr == BE1_IP && port == BE_PORT);
	CHECK(!bpf_map_lookup_elem(&lb4_sock_revnat, &skey));
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
	put_master4_flags(SVC_IP, SVC_PORT, IPPROTO_TCP, 2, LB_SVC_CLUSTER_IP, LB_SVC_F_AFFINITY, 100);
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
	CHECK(fwd_once(skb, &again) == 0);
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

/* TCP: a socket connects once, so its entry is written without a lookup, and written right. */
SEC("tc")
int test_revnat_tcp_written_on_connect(struct __sk_buff *skb)
{
	struct lb4_sock_key skey = { .cookie = bpf_get_socket_cookie(skb), .address = BE1_IP, .port = BE_PORT };
	struct lb4_sock_revnat stale = { .address = SVC2_IP, .port = SVC_PORT, .rev_nat_index = REVNAT2 };
	struct lb4_sock_revnat *rev;
	__be32 addr = SVC_IP;
	__be16 port = SVC_PORT;

	clear4();
	put_backend4(1, 1, BE1_IP);
	put_master4(SVC_IP, SVC_PORT, IPPROTO_TCP, 1, LB_SVC_CLUSTER_IP);
	bpf_map_update_elem(&lb4_sock_revnat, &skey, &stale, BPF_ANY);
	CHECK(__sock4_xlate_fwd(skb, IPPROTO_TCP, &addr, &port) == 0);
	rev = bpf_map_lookup_elem(&lb4_sock_revnat, &skey);
	CHECK(rev && rev->address == SVC_IP && rev->port == SVC_PORT && rev->rev_nat_index == REVNAT);
	bpf_map_delete_elem(&lb4_sock_revnat, &skey);
	clear4();
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
