// bpf_link helpers: cgroup attach through a pinned link, pinned-link queries.
#pragma once

#include <bpf/libbpf.h>
#include <napi.h>

#include <string>

#include "errors.h"

namespace lbn {

// { id, name, tag, type, funcName? } of the program `fd` refers to. `name` is
// the kernel's (15 characters at most); `funcName` the main function's name
// in the program's BTF, whole, absent when it was loaded without BTF.
Napi::Object progInfoObject(Napi::Env env, int fd, const ErrCtx& ctx);

// Idempotent cgroup attach through a link pinned at linkPinPath:
// update the pinned link to `prog` if present, else attach + pin. The link is
// then released by this process (disconnected; our fd closed) so it lives on
// through the pin. Returns { linkId, updated }.
Napi::Object attachCgroupLink(Napi::Env env, struct bpf_program* prog, const std::string& cgroupPath,
                              const std::string& linkPinPath);

}  // namespace lbn
