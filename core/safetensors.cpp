// safetensors reading and writing (see safetensors.h). Assumes a little-endian
// host (checked at compile time). Loading validates the header completely
// (types, shapes, byte counts, offsets that tile the data region exactly,
// duplicate names) before reading any tensor; saving goes through a temporary
// file, fsync and rename. Runs on the calling thread; no shared state.
#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

namespace tandem {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

using json = nlohmann::json;
constexpr const char* kMetadataKey = "__metadata__";
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;  // in header (name) order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data region
  uint64_t data_bytes = 0;
};

// A read-only file handle closed on scope exit.
struct File {
  FILE* f = nullptr;
  ~File() {
    if (f) std::fclose(f);
  }
};

void read_exact(FILE* f, void* dst, uint64_t n, uint64_t file_offset, const std::string& path,
                const std::string& what) {
  TANDEM_CHECK(fseeko(f, static_cast<off_t>(file_offset), SEEK_SET) == 0, "safetensors file '", path,
               "': cannot seek to ", what, " at byte ", file_offset, ": ", std::strerror(errno));
  const size_t got = n ? std::fread(dst, 1, n, f) : 0;
  TANDEM_CHECK(got == n, "safetensors file '", path, "': short read of ", what, ": got ", got, " of ", n,
               " bytes", std::ferror(f) ? std::string(": ") + std::strerror(errno) : std::string());
}

// A short description of a JSON value for error messages: scalars as text (cut
// to 64 characters), containers by type only (dumping a deeply nested value
// would recurse as deep as the attacker chose, and could be 100 MB long).
std::string describe(const json& v) {
  if (v.is_structured()) return std::string("an ") + v.type_name();
  std::string s = v.dump();
  if (s.size() > 64) s = s.substr(0, 61) + "...";
  return s;
}

uint64_t as_offset(const json& v, const std::string& path, const std::string& name, const char* field) {
  TANDEM_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
               "safetensors file '", path, "', tensor '", name, "': ", field,
               " must hold non-negative integers, got ", describe(v));
  return v.get<uint64_t>();
}

Header read_header(FILE* f, const std::string& path) {
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  TANDEM_CHECK(!ec, "cannot stat safetensors file '", path, "': ", ec.message());
  TANDEM_CHECK(file_size >= 8, "safetensors file '", path, "' is too short: ", file_size,
               " bytes, needs at least 8 for the header length");
  uint8_t len_bytes[8];
  read_exact(f, len_bytes, 8, 0, path, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  TANDEM_CHECK(n <= file_size - 8, "safetensors file '", path, "': header length ", n,
               " is larger than the file after the 8-byte length prefix (", file_size - 8, " bytes)");
  TANDEM_CHECK(n <= kMaxHeaderBytes, "safetensors file '", path, "': header length ", n,
               " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  std::string text(n, '\0');
  read_exact(f, text.data(), n, 8, path, "the JSON header");

  // nlohmann keeps the last of duplicate keys silently; the callback notices them.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (ev == json::parse_event_t::key && !open_objects.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json h;
  try {
    h = json::parse(text, cb);
  } catch (const json::exception& e) {
    TANDEM_FAIL("safetensors file '", path, "': invalid JSON header: ", e.what());
  }
  TANDEM_CHECK(duplicate.empty(), "safetensors file '", path, "': duplicate name '", duplicate,
               "' in the JSON header");
  TANDEM_CHECK(h.is_object(), "safetensors file '", path, "': the JSON header must be an object, got ",
               h.type_name());

  Header out;
  out.data_start = 8 + n;
  out.data_bytes = file_size - 8 - n;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == kMetadataKey) {
      TANDEM_CHECK(v.is_object(), "safetensors file '", path, "': __metadata__ must be an object, got ",
                   v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        TANDEM_CHECK(m.value().is_string(), "safetensors file '", path, "': __metadata__ value of '", m.key(),
                     "' must be a string, got ", describe(m.value()));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    TANDEM_CHECK(!name.empty(), "safetensors file '", path, "': a tensor has an empty name");
    TANDEM_CHECK(v.is_object(), "safetensors file '", path, "', tensor '", name,
                 "': entry must be an object, got ", v.type_name());
    for (auto field = v.begin(); field != v.end(); ++field)
      TANDEM_CHECK(field.key() == "dtype" || field.key() == "shape" || field.key() == "data_offsets",
                   "safetensors file '", path, "', tensor '", name, "': unexpected field '", field.key(),
                   "', expected dtype, shape and data_offsets");
    TANDEM_CHECK(v.contains("dtype") && v["dtype"].is_string(), "safetensors file '", path, "', tensor '",
                 name, "': missing or non-string \"dtype\"");
    TANDEM_CHECK(v.contains("shape") && v["shape"].is_array(), "safetensors file '", path, "', tensor '",
                 name, "': missing or non-array \"shape\"");
    TANDEM_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
                 "safetensors file '", path, "', tensor '", name,
                 "': \"data_offsets\" must be an array [begin, end]");
    Entry e;
    e.name = name;
    const std::string dtype = v["dtype"].get<std::string>();
    try {
      e.dtype = dtype_from_safetensors(dtype);
    } catch (const Error&) {
      TANDEM_FAIL("safetensors file '", path, "', tensor '", name, "': unknown dtype '", dtype,
                  "', expected one of F32 F64 F16 BF16 I64 I32 U8");
    }
    // The product of the non-zero dimensions is bounded as well as numel: an
    // empty tensor's strides are products of its other dimensions and must not overflow.
    uint64_t numel = 1, nonzero = 1;
    for (const json& d : v["shape"]) {
      const uint64_t s = as_offset(d, path, name, "shape");
      TANDEM_CHECK(s <= (uint64_t(1) << 62) && (s == 0 || nonzero <= (uint64_t(1) << 62) / s),
                   "safetensors file '", path, "', tensor '", name, "': shape with ", v["shape"].size(),
                   " dimensions is too large");
      if (s != 0) nonzero *= s;
      numel *= s;
      e.shape.push_back(static_cast<int64_t>(s));
    }
    e.begin = as_offset(v["data_offsets"][0], path, name, "data_offsets");
    e.end = as_offset(v["data_offsets"][1], path, name, "data_offsets");
    TANDEM_CHECK(e.begin <= e.end && e.end <= out.data_bytes, "safetensors file '", path, "', tensor '", name,
                 "': data_offsets [", e.begin, ", ", e.end, "] out of range for a data region of ",
                 out.data_bytes, " bytes");
    // numel <= 2^62 but times the element size may wrap: compare without multiplying.
    const uint64_t esize = element_size(e.dtype);
    TANDEM_CHECK(numel <= out.data_bytes / esize, "safetensors file '", path, "', tensor '", name, "': shape ",
                 shape_str(e.shape), " of ", dtype, " needs ",
                 numel <= UINT64_MAX / esize ? std::to_string(numel * esize) + " bytes"
                                             : std::to_string(numel) + " elements of " + std::to_string(esize) +
                                                   " bytes",
                 ", more than the data region of ", out.data_bytes, " bytes holds");
    const uint64_t nbytes = numel * esize;
    TANDEM_CHECK(nbytes == e.end - e.begin, "safetensors file '", path, "', tensor '", name, "': shape ",
                 shape_str(e.shape), " of ", dtype, " needs ", nbytes, " bytes but data_offsets [", e.begin,
                 ", ", e.end, "] span ", e.end - e.begin);
    out.entries.push_back(std::move(e));
  }

  // The byte ranges must tile [0, data_bytes): no overlap, no hole, nothing after.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : out.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Entry* last = nullptr;
  for (const Entry* e : by_offset) {
    TANDEM_CHECK(e->begin >= covered, "safetensors file '", path, "': tensor '", e->name, "' [", e->begin,
                 ", ", e->end, ") overlaps tensor '", last ? last->name : "", "' [", last ? last->begin : 0,
                 ", ", covered, ")");
    TANDEM_CHECK(e->begin == covered, "safetensors file '", path, "': hole in the data region: bytes [",
                 covered, ", ", e->begin, ") before tensor '", e->name, "' belong to no tensor");
    if (e->end > covered || last == nullptr) {
      covered = e->end;
      last = e;
    }
  }
  TANDEM_CHECK(covered == out.data_bytes, "safetensors file '", path, "': the tensors cover ", covered,
               " bytes of data but the data region holds ", out.data_bytes, " bytes");
  return out;
}

File open_for_read(const std::string& path) {
  File file;
  file.f = std::fopen(path.c_str(), "rb");
  TANDEM_CHECK(file.f != nullptr, "cannot open safetensors file '", path, "': ", std::strerror(errno));
  return file;
}

void write_all(int fd, const void* data, size_t n, const std::string& tmp) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0 && errno == EINTR) continue;
    TANDEM_CHECK(w > 0, "write error on '", tmp, "': ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

TensorMap load_safetensors(const std::string& path) {
  File file = open_for_read(path);
  const Header h = read_header(file.f, path);
  TensorMap out;
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    read_exact(file.f, t.raw_data(), e.end - e.begin, h.data_start + e.begin, path,
               "the data of tensor '" + e.name + "'");
    out.emplace(e.name, std::move(t));
  }
  return out;
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  File file = open_for_read(path);
  return read_header(file.f, path).metadata;
}

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  struct Item {
    const std::string* name;
    Tensor host;
  };
  std::vector<Item> items;
  for (const auto& [name, t] : tensors) {
    TANDEM_CHECK(!name.empty() && name != kMetadataKey, "save_safetensors('", path,
                 "'): invalid tensor name '", name, "'");
    TANDEM_CHECK(t.defined(), "save_safetensors('", path, "'): tensor '", name, "' is undefined");
    items.push_back({&name, t.to(Device::cpu()).contiguous()});
  }
  // Largest element first keeps every tensor aligned to its element size.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return element_size(a.host.dtype()) > element_size(b.host.dtype());
  });

  json h = json::object();
  if (!metadata.empty()) h[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const Item& it : items) {
    const uint64_t nbytes = it.host.nbytes();
    h[*it.name] = {{"dtype", safetensors_name(it.host.dtype())},
                   {"shape", it.host.shape()},
                   {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = h.dump();
  } catch (const json::exception& e) {
    TANDEM_FAIL("save_safetensors('", path,
                "'): cannot encode the header (names and metadata must be UTF-8): ", e.what());
  }
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TANDEM_CHECK(fd >= 0, "cannot save safetensors file '", path, "': cannot create '", tmp,
               "': ", std::strerror(errno), " (is the directory there and writable?)");
  bool open = true;
  try {
    write_all(fd, len_bytes, 8, tmp);
    write_all(fd, text.data(), text.size(), tmp);
    for (const Item& it : items)
      if (it.host.nbytes()) write_all(fd, it.host.raw_data(), it.host.nbytes(), tmp);
    TANDEM_CHECK(::fsync(fd) == 0, "fsync of '", tmp, "' failed: ", std::strerror(errno));
    open = false;
    TANDEM_CHECK(::close(fd) == 0, "close of '", tmp, "' failed: ", std::strerror(errno));
  } catch (...) {
    if (open) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    TANDEM_FAIL("cannot save safetensors file '", path, "': renaming '", tmp,
                "' over it failed: ", std::strerror(err));
  }
  // Make the rename itself durable; failure here (some filesystems) does not undo the save.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace tandem
