// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * BTF anchor, never loaded: clang emits BTF only for types that are used, so
 * this object uses the ABI enums (the structs are already in sock.bpf.o's
 * map definitions). scripts/gen-abi.mjs reads both objects' BTF.
 */
#include <linux/types.h>
#include "include/lb_types.h"

struct lb_abi_enums {
	enum lb_svc_type svc_type;
	enum lb_svc_flags svc_flags;
	enum lb_backend_state backend_state;
	enum lb_metric metric;
	enum lb_scope scope;
	enum lb_ct_dir ct_dir;
	enum lb_ct_flags ct_flags;
	enum lb_np_config_flags np_config_flags;
	enum lb_device_flags device_flags;
	enum lb_maglev_layout maglev_layout;
};

struct lb_abi_enums lb_abi_anchor __attribute__((section(".abi"), used));
