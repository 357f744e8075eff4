#include "bpf_map.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>

#include <algorithm>
#include <memory>
#include <cerrno>
#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

#include "errors.h"

namespace lbn {

namespace {

constexpr int kENOTSUPP = 524;  // kernel-internal "not supported" (no batch op)

bool isPerCpuType(uint32_t type) {
  switch (type) {
    case BPF_MAP_TYPE_PERCPU_HASH:
    case BPF_MAP_TYPE_PERCPU_ARRAY:
    case BPF_MAP_TYPE_LRU_PERCPU_HASH:
    case BPF_MAP_TYPE_PERCPU_CGROUP_STORAGE:
      return true;
    default:
      return false;
  }
}

Napi::Buffer<uint8_t> copyBuf(Napi::Env env, const uint8_t* p, size_t n) {
  return Napi::Buffer<uint8_t>::Copy(env, p, n);
}

}  // namespace

int mapInfoByFd(int fd, MapMeta* out) {
  struct bpf_map_info info;
  std::memset(&info, 0, sizeof info);
  __u32 len = sizeof info;
  int r = bpf_obj_get_info_by_fd(fd, &info, &len);
  if (r != 0) return errFromRet(r);
  out->name = info.name;
  out->type = info.type;
  out->keySize = info.key_size;
  out->valueSize = info.value_size;
  out->maxEntries = info.max_entries;
  out->flags = info.map_flags;
  out->id = info.id;
  return 0;
}

Napi::Function BpfMap::Define(Napi::Env env) {
  return DefineClass(
      env, "RawBpfMap",
      {
          InstanceAccessor<&BpfMap::GetName>("name"),
          InstanceAccessor<&BpfMap::GetType>("type"),
          InstanceAccessor<&BpfMap::GetKeySize>("keySize"),
          InstanceAccessor<&BpfMap::GetValueSize>("valueSize"),
          InstanceAccessor<&BpfMap::GetMaxEntries>("maxEntries"),
          InstanceAccessor<&BpfMap::GetFlags>("flags"),
          InstanceAccessor<&BpfMap::GetId>("id"),
          InstanceAccessor<&BpfMap::GetFd>("fd"),
          InstanceAccessor<&BpfMap::GetPerCpu>("perCpu"),
          InstanceAccessor<&BpfMap::GetValueBufSize>("valueBufSize"),
          InstanceMethod<&BpfMap::Lookup>("lookup"),
          InstanceMethod<&BpfMap::Update>("update"),
          InstanceMethod<&BpfMap::Delete>("delete"),
          InstanceMethod<&BpfMap::Keys>("keys"),
          InstanceMethod<&BpfMap::Entries>("entries"),
          InstanceMethod<&BpfMap::EntriesFlat>("entriesFlat"),
          InstanceMethod<&BpfMap::BatchUpdate>("batchUpdate"),
          InstanceMethod<&BpfMap::Layout>("layout"),
          InstanceMethod<&BpfMap::Close>("close"),
      });
}

// Constructed from JS it is an inert, closed map; the factories fill it in.
BpfMap::BpfMap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<BpfMap>(info) {}

void BpfMap::init(const MapMeta& meta) {
  meta_ = meta;
  perCpu_ = isPerCpuType(meta.type);
  if (perCpu_) {
    int ncpu = libbpf_num_possible_cpus();
    if (ncpu < 1) ncpu = 1;
    valueBufSize_ = ((static_cast<size_t>(meta.valueSize) + 7) / 8 * 8) * static_cast<size_t>(ncpu);
  } else {
    valueBufSize_ = meta.valueSize;
  }
  open_ = true;
}

Napi::Object BpfMap::FromObject(Napi::Env env, std::shared_ptr<ObjState> owner, struct bpf_map* map) {
  ErrCtx c;
  c.map = bpf_map__name(map);
  int fd = bpf_map__fd(map);
  if (fd < 0) {
    c.reason = "map has no fd (object not loaded, or map not auto-created)";
    throwBpfError(env, "bpf_map__fd", EBADF, c);
  }
  MapMeta meta;
  if (int e = mapInfoByFd(fd, &meta)) throwBpfError(env, "bpf_obj_get_info_by_fd", e, c);
  meta.name = c.map;  // libbpf's full name (kernel truncates to 15 chars)
  Napi::Object o = addonData(env).mapCtor.New({});
  BpfMap* m = BpfMap::Unwrap(o);
  m->owner_ = std::move(owner);
  m->fd_ = fd;
  m->init(meta);
  return o;
}

Napi::Object BpfMap::FromFd(Napi::Env env, UniqueFd fd, const MapMeta& meta) {
  Napi::Object o = addonData(env).mapCtor.New({});
  BpfMap* m = BpfMap::Unwrap(o);
  m->fd_ = fd.get();
  m->ownFd_ = std::move(fd);
  m->init(meta);
  return o;
}

int BpfMap::fd(const char* op) {
  ErrCtx c;
  c.map = meta_.name;
  if (!open_) {
    c.reason = "map is closed";
    throwBpfError(Env(), op, EBADF, c);
  }
  if (owner_ && owner_->obj == nullptr) {
    c.reason = "the BPF object owning this map is closed";
    throwBpfError(Env(), op, EBADF, c);
  }
  return fd_;
}

void BpfMap::checkKey(const Napi::Uint8Array& key) {
  if (key.ByteLength() != meta_.keySize) throwSizeError(Env(), meta_.name, "key", meta_.keySize, key.ByteLength());
}

void BpfMap::checkValue(const Napi::Uint8Array& value) {
  if (value.ByteLength() != valueBufSize_) throwSizeError(Env(), meta_.name, "value", valueBufSize_, value.ByteLength());
}

Napi::Value BpfMap::GetName(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), meta_.name); }
Napi::Value BpfMap::GetType(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), meta_.type); }
Napi::Value BpfMap::GetKeySize(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), meta_.keySize); }
Napi::Value BpfMap::GetValueSize(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), meta_.valueSize); }
Napi::Value BpfMap::GetMaxEntries(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), meta_.maxEntries); }
Napi::Value BpfMap::GetFlags(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), meta_.flags); }
Napi::Value BpfMap::GetId(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), meta_.id); }
Napi::Value BpfMap::GetPerCpu(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), perCpu_); }
Napi::Value BpfMap::GetValueBufSize(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(valueBufSize_));
}
Napi::Value BpfMap::GetFd(const Napi::CallbackInfo& info) {
  bool usable = open_ && !(owner_ && owner_->obj == nullptr);
  return Napi::Number::New(info.Env(), usable ? fd_ : -1);
}

Napi::Value BpfMap::Lookup(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint8Array key = argBytes(info, 0, "key");
  int mfd = fd("bpf_map_lookup_elem");
  checkKey(key);
  Napi::Buffer<uint8_t> out = Napi::Buffer<uint8_t>::New(env, valueBufSize_);
  int r = bpf_map_lookup_elem(mfd, key.Data(), out.Data());
  if (r != 0) {
    int e = errFromRet(r);
    if (e == ENOENT) return env.Null();
    ErrCtx c;
    c.map = meta_.name;
    throwBpfError(env, "bpf_map_lookup_elem", e, c);
  }
  return out;
}

Napi::Value BpfMap::Update(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint8Array key = argBytes(info, 0, "key");
  Napi::Uint8Array value = argBytes(info, 1, "value");
  uint64_t flags = argOptU64(info, 2, "flags", BPF_ANY);
  int mfd = fd("bpf_map_update_elem");
  checkKey(key);
  checkValue(value);
  int r = bpf_map_update_elem(mfd, key.Data(), value.Data(), flags);
  if (r != 0) {
    ErrCtx c;
    c.map = meta_.name;
    throwBpfError(env, "bpf_map_update_elem", errFromRet(r), c);
  }
  return env.Undefined();
}

Napi::Value BpfMap::Delete(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint8Array key = argBytes(info, 0, "key");
  int mfd = fd("bpf_map_delete_elem");
  checkKey(key);
  int r = bpf_map_delete_elem(mfd, key.Data());
  if (r != 0) {
    int e = errFromRet(r);
    if (e == ENOENT) return Napi::Boolean::New(env, false);
    ErrCtx c;
    c.map = meta_.name;
    throwBpfError(env, "bpf_map_delete_elem", e, c);
  }
  return Napi::Boolean::New(env, true);
}

// Walk with get_next_key. When the current key is deleted under us, hash maps
// restart from the first bucket: dedupe, and bound the walk so it terminates.
template <typename F>
static void walkKeys(Napi::Env env, int fd, const MapMeta& meta, F&& onKey) {
  std::vector<uint8_t> cur(std::max<uint32_t>(meta.keySize, 1));
  std::vector<uint8_t> next(cur.size());
  std::unordered_set<std::string> seen;
  bool first = true;
  size_t budget = static_cast<size_t>(meta.maxEntries) * 4 + 1024;
  while (budget-- > 0) {
    int r = bpf_map_get_next_key(fd, first ? nullptr : cur.data(), next.data());
    if (r != 0) {
      int e = errFromRet(r);
      if (e == ENOENT) return;
      ErrCtx c;
      c.map = meta.name;
      throwBpfError(env, "bpf_map_get_next_key", e, c);
    }
    std::string k(reinterpret_cast<const char*>(next.data()), meta.keySize);
    if (seen.insert(k).second) onKey(next.data());
    cur.swap(next);
    first = false;
  }
}

Napi::Value BpfMap::Keys(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int mfd = fd("bpf_map_get_next_key");
  Napi::Array out = Napi::Array::New(env);
  uint32_t i = 0;
  walkKeys(env, mfd, meta_, [&](const uint8_t* k) { out.Set(i++, copyBuf(env, k, meta_.keySize)); });
  return out;
}

// Every entry by get_next_key + lookup_elem: onEntries(keys, values, n) with n = 1.
template <typename F>
void BpfMap::walkEntries(Napi::Env env, int mfd, F&& onEntries) {
  std::vector<uint8_t> val(std::max<size_t>(valueBufSize_, 1));
  walkKeys(env, mfd, meta_, [&](const uint8_t* k) {
    int r = bpf_map_lookup_elem(mfd, k, val.data());
    if (r != 0) {
      int e = errFromRet(r);
      if (e == ENOENT) return;  // deleted since get_next_key: skip
      ErrCtx c;
      c.map = meta_.name;
      throwBpfError(env, "bpf_map_lookup_elem", e, c);
    }
    onEntries(k, val.data(), 1u);
  });
}

// Every entry by BPF_MAP_LOOKUP_BATCH, chunk by chunk: onEntries(keys, values, n)
// with n entries packed back to back. False (nothing passed on) when the kernel or
// the map type has no batch lookup.
template <typename F>
bool BpfMap::batchEntries(Napi::Env env, int mfd, F&& onEntries) {
  uint32_t chunk = std::clamp<uint32_t>(meta_.maxEntries, 1, 1024);
  // The batch cursor is opaque: a u32 bucket for hash maps, a key for others.
  std::vector<uint8_t> inBatch(std::max<uint32_t>(meta_.keySize, 8));
  std::vector<uint8_t> outBatch(inBatch.size());
  std::vector<uint8_t> keys, vals;
  bool first = true;
  LIBBPF_OPTS(bpf_map_batch_opts, opts);
  for (;;) {
    keys.resize(static_cast<size_t>(chunk) * meta_.keySize);
    vals.resize(static_cast<size_t>(chunk) * valueBufSize_);
    uint32_t count = chunk;
    int r = bpf_map_lookup_batch(mfd, first ? nullptr : inBatch.data(), outBatch.data(), keys.data(),
                                 vals.data(), &count, &opts);
    int e = r != 0 ? errFromRet(r) : 0;
    if (e != 0 && e != ENOENT) {
      // No batch support (old kernel: EINVAL; map type without the op: ENOTSUPP).
      // Nothing was passed on yet, whatever count says (early errors leave it untouched).
      if (first && (e == EINVAL || e == kENOTSUPP || e == EOPNOTSUPP)) return false;
      if (e == ENOSPC && chunk < (1u << 20)) {  // a hash bucket bigger than chunk: nothing copied
        chunk *= 2;
        continue;
      }
      ErrCtx c;
      c.map = meta_.name;
      throwBpfError(env, "bpf_map_lookup_batch", e, c);
    }
    if (count > chunk) count = chunk;
    if (count > 0) onEntries(keys.data(), vals.data(), count);
    if (e == ENOENT) return true;  // end of map
    inBatch.swap(outBatch);
    first = false;
  }
}

int BpfMap::iterFd(Napi::Env env, const char* op) {
  int mfd = fd(op);
  if (meta_.keySize == 0) {  // queue/stack/ringbuf: nothing to iterate by key
    ErrCtx c;
    c.map = meta_.name;
    c.reason = "map has no keys to iterate";
    throwBpfError(env, op, EINVAL, c);
  }
  return mfd;
}

Napi::Value BpfMap::Entries(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int mfd = iterFd(env, "bpf_map_lookup_batch");
  Napi::Array out = Napi::Array::New(env);
  uint32_t n = 0;
  auto append = [&](const uint8_t* keys, const uint8_t* vals, uint32_t count) {
    for (uint32_t j = 0; j < count; j++) {
      Napi::Array pair = Napi::Array::New(env, 2);
      pair.Set(0u, copyBuf(env, keys + static_cast<size_t>(j) * meta_.keySize, meta_.keySize));
      pair.Set(1u, copyBuf(env, vals + static_cast<size_t>(j) * valueBufSize_, valueBufSize_));
      out.Set(n++, pair);
    }
  };
  if (!batchEntries(env, mfd, append)) walkEntries(env, mfd, append);
  return out;
}

// Every entry as two buffers: { keys, values, count }, keys back to back
// (keySize each), values likewise (valueBufSize each). No object per entry.
Napi::Value BpfMap::EntriesFlat(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int mfd = iterFd(env, "bpf_map_lookup_batch");
  std::vector<uint8_t> keys, vals;
  uint32_t n = 0;
  auto append = [&](const uint8_t* k, const uint8_t* v, uint32_t count) {
    keys.insert(keys.end(), k, k + static_cast<size_t>(count) * meta_.keySize);
    vals.insert(vals.end(), v, v + static_cast<size_t>(count) * valueBufSize_);
    n += count;
  };
  if (!batchEntries(env, mfd, append)) walkEntries(env, mfd, append);
  Napi::Object out = Napi::Object::New(env);
  out.Set("keys", copyBuf(env, keys.data(), keys.size()));
  out.Set("values", copyBuf(env, vals.data(), vals.size()));
  out.Set("count", Napi::Number::New(env, n));
  return out;
}

Napi::Value BpfMap::BatchUpdate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Uint8Array keys = argBytes(info, 0, "keys");
  Napi::Uint8Array values = argBytes(info, 1, "values");
  uint32_t count = argU32(info, 2, "count");
  uint64_t flags = argOptU64(info, 3, "flags", BPF_ANY);
  int mfd = fd("bpf_map_update_batch");
  size_t wantK = static_cast<size_t>(count) * meta_.keySize;
  size_t wantV = static_cast<size_t>(count) * valueBufSize_;
  if (keys.ByteLength() != wantK) throwSizeError(env, meta_.name, "keys", wantK, keys.ByteLength());
  if (values.ByteLength() != wantV) throwSizeError(env, meta_.name, "values", wantV, values.ByteLength());
  if (count == 0) return Napi::Number::New(env, 0);

  LIBBPF_OPTS(bpf_map_batch_opts, opts, .elem_flags = flags);
  uint32_t done = count;
  int r = bpf_map_update_batch(mfd, keys.Data(), values.Data(), &done, &opts);
  if (r == 0) return Napi::Number::New(env, done);
  int e = errFromRet(r);
  // The kernel leaves count untouched when it rejects the call up front; an
  // error with count == input therefore means nothing was written.
  if (done >= count) done = 0;
  const char* op = "bpf_map_update_batch";
  const bool existFlags = (flags & (BPF_NOEXIST | BPF_EXIST)) != 0;
  if (done == 0 && (e == kENOTSUPP || e == EOPNOTSUPP || (e == EINVAL && existFlags))) {
    // No batch op for this map type, or NOEXIST/EXIST refused in batch
    // elem_flags (Linux 6.18 allows only BPF_F_LOCK/per-CPU flags there):
    // same semantics, one element at a time.
    op = "bpf_map_update_elem";
    e = 0;
    for (; done < count; done++) {
      int r2 = bpf_map_update_elem(mfd, keys.Data() + static_cast<size_t>(done) * meta_.keySize,
                                   values.Data() + static_cast<size_t>(done) * valueBufSize_, flags);
      if (r2 != 0) {
        e = errFromRet(r2);
        break;
      }
    }
    if (e == 0) return Napi::Number::New(env, done);
  }
  ErrCtx c;
  c.map = meta_.name;
  c.detail = std::to_string(done) + " of " + std::to_string(count) + " written";
  Napi::Error err = makeBpfError(env, op, e, c);
  err.Value().Set("count", Napi::Number::New(env, done));
  throw err;
}

Napi::Value BpfMap::Close(const Napi::CallbackInfo& info) {
  ownFd_.reset();
  owner_.reset();
  fd_ = -1;
  open_ = false;
  return info.Env().Undefined();
}

// ---- BTF layouts ----

namespace {

constexpr int kMaxLayoutDepth = 16;

Napi::Value layoutOf(Napi::Env env, const struct btf* btf, uint32_t id, int depth) {
  Napi::Object o = Napi::Object::New(env);
  std::string name;
  const struct btf_type* t = btf__type_by_id(btf, id);
  // Peel typedefs and qualifiers, keeping the first typedef's name.
  while (t != nullptr && (btf_is_typedef(t) || btf_is_mod(t))) {
    if (name.empty() && btf_is_typedef(t)) name = btf__name_by_offset(btf, t->name_off);
    id = t->type;
    t = btf__type_by_id(btf, id);
  }
  if (t == nullptr || depth > kMaxLayoutDepth) {
    o.Set("kind", "other");
    o.Set("name", name);
    o.Set("size", 0);
    return o;
  }
  if (name.empty()) name = btf__name_by_offset(btf, t->name_off);
  o.Set("name", name);
  __s64 sz = btf__resolve_size(btf, id);
  o.Set("size", Napi::Number::New(env, sz < 0 ? 0 : static_cast<double>(sz)));
  if (btf_is_int(t)) {
    o.Set("kind", "int");
    o.Set("signed", Napi::Boolean::New(env, (btf_int_encoding(t) & BTF_INT_SIGNED) != 0));
  } else if (btf_is_enum(t) || btf_is_enum64(t)) {
    o.Set("kind", "enum");
    o.Set("signed", Napi::Boolean::New(env, btf_kflag(t)));
  } else if (btf_is_struct(t) || btf_is_union(t)) {
    o.Set("kind", btf_is_struct(t) ? "struct" : "union");
    Napi::Array members = Napi::Array::New(env);
    const struct btf_member* m = btf_members(t);
    for (uint32_t i = 0; i < btf_vlen(t); i++, m++) {
      Napi::Object mo = Napi::Object::New(env);
      uint32_t bitOff = btf_member_bit_offset(t, i);
      uint32_t bitSize = btf_member_bitfield_size(t, i);
      mo.Set("name", btf__name_by_offset(btf, m->name_off));
      mo.Set("offset", Napi::Number::New(env, bitOff / 8));
      if (bitSize != 0 || bitOff % 8 != 0) mo.Set("bitfield", Napi::Boolean::New(env, true));
      mo.Set("type", layoutOf(env, btf, m->type, depth + 1));
      members.Set(i, mo);
    }
    o.Set("members", members);
  } else if (btf_is_array(t)) {
    const struct btf_array* a = btf_array(t);
    o.Set("kind", "array");
    o.Set("count", Napi::Number::New(env, a->nelems));
    o.Set("elem", layoutOf(env, btf, a->type, depth + 1));
  } else {
    o.Set("kind", "other");
  }
  return o;
}

}  // namespace

Napi::Value btfTypeLayout(Napi::Env env, const struct btf* btf, uint32_t typeId) {
  if (btf == nullptr || typeId == 0) return env.Null();
  return layoutOf(env, btf, typeId, 0);
}

// layout(): the BTF layouts of this map's key and value, from the BTF the
// kernel keeps with the map (bpf_map_info.btf_id), or null when the map was
// created without BTF.
Napi::Value BpfMap::Layout(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int mfd = fd("bpf_obj_get_info_by_fd");
  struct bpf_map_info mi;
  std::memset(&mi, 0, sizeof mi);
  __u32 len = sizeof mi;
  ErrCtx c;
  c.map = meta_.name;
  int r = bpf_obj_get_info_by_fd(mfd, &mi, &len);
  if (r != 0) throwBpfError(env, "bpf_obj_get_info_by_fd", errFromRet(r), c);
  if (mi.btf_id == 0) return env.Null();
  errno = 0;
  struct btf* btf = btf__load_from_kernel_by_id(mi.btf_id);
  if (btf == nullptr) {
    c.detail = "btf id " + std::to_string(mi.btf_id);
    throwBpfError(env, "btf__load_from_kernel_by_id", errFromErrno(), c);
  }
  std::unique_ptr<struct btf, void (*)(struct btf*)> guard(btf, btf__free);
  Napi::Object o = Napi::Object::New(env);
  o.Set("key", btfTypeLayout(env, btf, mi.btf_key_type_id));
  o.Set("value", btfTypeLayout(env, btf, mi.btf_value_type_id));
  return o;
}

// openPinnedMap(path): bpf_obj_get + info; the returned map owns the fd.
static Napi::Value OpenPinnedMap(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = argString(info, 0, "path");
  ErrCtx c;
  c.path = path;
  int r = bpf_obj_get(path.c_str());
  if (r < 0) throwBpfError(env, "bpf_obj_get", errFromRet(r), c);
  UniqueFd fd(r);
  std::string kind = bpfFdKind(fd.get());
  if (kind != "bpf-map") {
    c.reason = "pinned object is " + (kind.empty() ? std::string("unknown") : kind) + ", not a BPF map";
    throwBpfError(env, "bpf_obj_get", EINVAL, c);
  }
  MapMeta meta;
  if (int e = mapInfoByFd(fd.get(), &meta)) throwBpfError(env, "bpf_obj_get_info_by_fd", e, c);
  return BpfMap::FromFd(env, std::move(fd), meta);
}

// mapCreate({ type, keySize, valueSize, maxEntries, flags?, name? }): bpf_map_create;
// the returned map owns the fd. For maps no object declares (the inner maps
// of a map-in-map, filled and then put into the outer map by fd).
static Napi::Value MapCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsObject()) throwArgError(env, "mapCreate: expected an options object");
  Napi::Object o = info[0].As<Napi::Object>();
  auto num = [&](const char* k, bool required, uint32_t dflt) -> uint32_t {
    Napi::Value v = o.Get(k);
    if (v.IsUndefined()) {
      if (required) throwArgError(env, std::string("mapCreate: options.") + k + " is required");
      return dflt;
    }
    if (!v.IsNumber()) throwArgError(env, std::string("mapCreate: options.") + k + " must be a number");
    double d = v.As<Napi::Number>().DoubleValue();
    if (d < 0 || d > 4294967295.0 || d != static_cast<double>(static_cast<uint32_t>(d))) throwArgError(env, std::string("mapCreate: options.") + k + " must be an integer in [0, 2^32)");
    return static_cast<uint32_t>(d);
  };
  uint32_t type = num("type", true, 0);
  uint32_t keySize = num("keySize", true, 0);
  uint32_t valueSize = num("valueSize", true, 0);
  uint32_t maxEntries = num("maxEntries", true, 0);
  uint32_t flags = num("flags", false, 0);
  std::string name;
  Napi::Value nv = o.Get("name");
  if (nv.IsString()) name = nv.As<Napi::String>().Utf8Value();
  LIBBPF_OPTS(bpf_map_create_opts, opts, .map_flags = flags);
  int r = bpf_map_create(static_cast<enum bpf_map_type>(type), name.empty() ? nullptr : name.substr(0, BPF_OBJ_NAME_LEN - 1).c_str(), keySize, valueSize, maxEntries, &opts);
  ErrCtx c;
  c.map = name;
  if (r < 0) throwBpfError(env, "bpf_map_create", errFromRet(r), c);
  UniqueFd fd(r);
  MapMeta meta;
  if (int e = mapInfoByFd(fd.get(), &meta)) throwBpfError(env, "bpf_obj_get_info_by_fd", e, c);
  return BpfMap::FromFd(env, std::move(fd), meta);
}

// mapById(id): bpf_map_get_fd_by_id + info (a map-in-map's lookups give inner
// map ids); null when no map has that id any more.
static Napi::Value MapById(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t id = static_cast<uint32_t>(argI32(info, 0, "id"));
  int r = bpf_map_get_fd_by_id(id);
  if (r < 0) {
    if (errno == ENOENT) return env.Null();
    ErrCtx c;
    throwBpfError(env, "bpf_map_get_fd_by_id", errno, c);
  }
  UniqueFd fd(r);
  MapMeta meta;
  ErrCtx c;
  if (int e = mapInfoByFd(fd.get(), &meta)) throwBpfError(env, "bpf_obj_get_info_by_fd", e, c);
  return BpfMap::FromFd(env, std::move(fd), meta);
}

void InitMap(Napi::Env env, Napi::Object exports) {
  Napi::Function ctor = BpfMap::Define(env);
  addonData(env).mapCtor = Napi::Persistent(ctor);
  exports.Set("RawBpfMap", ctor);
  exports.Set("openPinnedMap", Napi::Function::New(env, OpenPinnedMap, "openPinnedMap"));
  exports.Set("mapCreate", Napi::Function::New(env, MapCreate, "mapCreate"));
  exports.Set("mapById", Napi::Function::New(env, MapById, "mapById"));
}

}  // namespace lbn
