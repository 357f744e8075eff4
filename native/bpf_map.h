// RawBpfMap: byte-level access to one BPF map through its fd.
#pragma once

#include <bpf/libbpf.h>
#include <napi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "bpf_object.h"
#include "common.h"

namespace lbn {

struct MapMeta {
  std::string name;
  uint32_t type = 0;
  uint32_t keySize = 0;
  uint32_t valueSize = 0;
  uint32_t maxEntries = 0;
  uint32_t flags = 0;
  uint32_t id = 0;
};

class BpfMap : public Napi::ObjectWrap<BpfMap> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit BpfMap(const Napi::CallbackInfo& info);

  // A map owned by a loaded object: borrows bpf_map__fd, keeps the object state alive.
  static Napi::Object FromObject(Napi::Env env, std::shared_ptr<ObjState> owner,
                                 struct bpf_map* map);
  // A map opened by path (or id): owns fd.
  static Napi::Object FromFd(Napi::Env env, UniqueFd fd, const MapMeta& meta);

 private:
  void init(const MapMeta& meta);
  int fd(const char* op);  // the usable fd, or throws EBADF
  void checkKey(const Napi::Uint8Array& key);
  void checkValue(const Napi::Uint8Array& value);
  int iterFd(Napi::Env env, const char* op);  // fd(op), or throws EINVAL for a map without keys
  template <typename F>
  bool batchEntries(Napi::Env env, int fd, F&& onEntries);
  template <typename F>
  void walkEntries(Napi::Env env, int fd, F&& onEntries);

  Napi::Value GetName(const Napi::CallbackInfo& info);
  Napi::Value GetType(const Napi::CallbackInfo& info);
  Napi::Value GetKeySize(const Napi::CallbackInfo& info);
  Napi::Value GetValueSize(const Napi::CallbackInfo& info);
  Napi::Value GetMaxEntries(const Napi::CallbackInfo& info);
  Napi::Value GetFlags(const Napi::CallbackInfo& info);
  Napi::Value GetId(const Napi::CallbackInfo& info);
  Napi::Value GetFd(const Napi::CallbackInfo& info);
  Napi::Value GetPerCpu(const Napi::CallbackInfo& info);
  Napi::Value GetValueBufSize(const Napi::CallbackInfo& info);
  Napi::Value Lookup(const Napi::CallbackInfo& info);
  Napi::Value Update(const Napi::CallbackInfo& info);
  Napi::Value Delete(const Napi::CallbackInfo& info);
  Napi::Value Keys(const Napi::CallbackInfo& info);
  Napi::Value Entries(const Napi::CallbackInfo& info);
  Napi::Value EntriesFlat(const Napi::CallbackInfo& info);
  Napi::Value BatchUpdate(const Napi::CallbackInfo& info);
  Napi::Value Layout(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);

  std::shared_ptr<ObjState> owner_;  // set for object maps
  UniqueFd ownFd_;                   // set for maps opened by path
  int fd_ = -1;
  bool open_ = false;
  MapMeta meta_;
  bool perCpu_ = false;
  size_t valueBufSize_ = 0;
};

// Map info from the kernel for any map fd (bpf_obj_get_info_by_fd).
int mapInfoByFd(int fd, MapMeta* out);

}  // namespace lbn

// ---- BTF layouts (map key/value types), for layout migration ----
struct btf;
namespace lbn {

// The layout of BTF type `typeId` as a JS object:
//   { kind: 'int'|'enum'|'struct'|'union'|'array'|'other', name, size,
//     signed? (int), members? [{ name, offset, bitfield?, type }], elem?, count? }
// `name` is the outermost typedef's name when there is one (so __be32 stays
// visible as such), else the type's own name ('' when anonymous). Offsets
// and sizes are in bytes. Nothing lbctl-specific: it reports what BTF says.
Napi::Value btfTypeLayout(Napi::Env env, const struct btf* btf, uint32_t typeId);

}  // namespace lbn
