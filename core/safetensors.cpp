// safetensors reading and writing (see safetensors.h). Assumes a little-endian
// host (checked at compile time). Loading verifies the header's CRC-32C and
// validates the header completely (types, shapes, byte counts, offsets that
// tile the data region exactly, duplicate names) before reading any tensor, and
// each tensor's CRC-32C as it is read; saving writes the checksums and goes
// through a temporary file, fsync and rename. Runs on the calling thread; the
// only shared state is the set of paths already warned about (a mutex guards it).
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
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <spdlog/spdlog.h>
#include <vector>

#include "core/checksum.h"

namespace tandem {

namespace {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

using json = nlohmann::json;
constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kHeaderEntry = "__header__";  // the header's own CRC in the checksum table
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

// Throws SafetensorsError for the file `path` (a variable in scope) and the tensor `tensor` ("" for none).
#define ST_CHECK(cond, tensor, ...)                                                  \
  do {                                                                               \
    if (!(cond)) [[unlikely]]                                                        \
      throw SafetensorsError(path, tensor, ::tandem::detail::str_cat(__VA_ARGS__)); \
  } while (0)

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;  // in header (name) order
  std::map<std::string, std::string> metadata;  // without the checksum table
  std::map<std::string, uint32_t> crcs;  // the checksum table; empty for a file without one
  bool has_crcs = false;
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
                const std::string& tensor, const std::string& what) {
  ST_CHECK(fseeko(f, static_cast<off_t>(file_offset), SEEK_SET) == 0, tensor, "cannot seek to ", what,
           " at byte ", file_offset, ": ", std::strerror(errno));
  const size_t got = n ? std::fread(dst, 1, n, f) : 0;
  ST_CHECK(got == n, tensor, "short read of ", what, ": got ", got, " of ", n, " bytes",
           std::ferror(f) ? std::string(": ") + std::strerror(errno) : std::string());
}

// A short description of a JSON value for error messages: scalars as text (cut
// to 64 characters), containers by type only (dumping a deeply nested value
// would recurse as deep as the attacker chose, and could be 100 MB long).
std::string describe(const json& v) {
  if (v.is_structured()) return std::string("an ") + v.type_name();
  std::string s = v.dump(-1, ' ', /*ensure_ascii=*/true);
  if (s.size() > 64) s = s.substr(0, 61) + "...";
  return s;
}

// A name for messages: printable ASCII as is, anything else as \xNN, at most 64 characters.
std::string printable(const std::string& name) {
  std::string out;
  for (unsigned char c : name) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out.size() > 64 ? out.substr(0, 61) + "..." : out;
}

}  // namespace

SafetensorsError::SafetensorsError(std::string path, std::string tensor, std::string problem)
    : Error("safetensors file '" + path + "'" + (tensor.empty() ? "" : ", tensor '" + printable(tensor) + "'") + ": " +
            problem),
      path_(std::move(path)),
      tensor_(printable(tensor)),
      problem_(std::move(problem)) {}

namespace {

uint64_t as_offset(const json& v, const std::string& path, const std::string& name, const char* field) {
  ST_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), name, field,
           " must hold non-negative integers, got ", describe(v));
  return v.get<uint64_t>();
}

// The header's JSON; duplicate keys (nlohmann keeps the last silently) and bad JSON are errors
// that say where, not the parser's own text.
json parse_header_json(const std::string& text, const std::string& path) {
  // nlohmann's parser ends the input at a NUL byte; valid JSON holds none (not even inside strings).
  const size_t nul = text.find('\0');
  ST_CHECK(nul == std::string::npos, "", "invalid JSON header: a NUL byte at byte ", nul, " of its ", text.size());
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
  } catch (const json::parse_error& e) {
    ST_CHECK(false, "", "invalid JSON header: not valid JSON at byte ", e.byte, " of its ", text.size());
  } catch (const json::exception& e) {
    ST_CHECK(false, "", "invalid JSON header (JSON error ", e.id, ")");
  }
  ST_CHECK(duplicate.empty(), "", "duplicate name '", printable(duplicate), "' in the JSON header");
  ST_CHECK(h.is_object(), "", "the JSON header must be an object, got ", h.type_name());
  return h;
}

uint32_t parse_crc(const json& v, const std::string& path, const std::string& tensor) {
  const bool ok = v.is_string() && v.get<std::string>().size() == 8 &&
                  v.get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos;
  ST_CHECK(ok, tensor, "its CRC-32C in __metadata__ \"", kChecksumMetadataKey,
           "\" must be 8 lower-case hex digits, got ", describe(v), " (the checksum table is damaged)");
  return static_cast<uint32_t>(std::stoul(v.get<std::string>(), nullptr, 16));
}

// Takes the checksum table out of the header `h` (see safetensors.h) and verifies the header's own
// CRC against it. A file without the table leaves `out.has_crcs` false.
void take_checksums(json& h, Header& out, const std::string& path) {
  auto md = h.find(kMetadataKey);
  if (md == h.end() || !md->is_object()) return;
  auto entry = md->find(kChecksumMetadataKey);
  if (entry == md->end()) {
    for (auto m = md->begin(); m != md->end(); ++m)
      ST_CHECK(!m.value().is_string() || m.value().get<std::string>().find(std::string("\"") + kHeaderEntry + "\"") ==
                                             std::string::npos,
               "", "__metadata__ \"", printable(m.key()), "\" holds a checksum table but is not named \"",
               kChecksumMetadataKey, "\" (the header is damaged)");
    return;
  }
  ST_CHECK(entry->is_string(), "", "__metadata__ \"", kChecksumMetadataKey, "\" must be a string, got ",
           describe(*entry));
  const json table = json::parse(entry->get<std::string>(), nullptr, /*allow_exceptions=*/false);
  ST_CHECK(table.is_object() && table.contains(kHeaderEntry), "", "__metadata__ \"", kChecksumMetadataKey,
           "\" is not a JSON object with a \"", kHeaderEntry, "\" entry (the checksum table is damaged)");
  for (auto it = table.begin(); it != table.end(); ++it) out.crcs[it.key()] = parse_crc(it.value(), path, it.key());
  out.has_crcs = true;
  const uint32_t stored = out.crcs.at(kHeaderEntry);
  out.crcs.erase(kHeaderEntry);
  json tensors = table;
  tensors.erase(kHeaderEntry);
  *entry = tensors.dump();
  const std::string canonical = h.dump();
  const uint32_t computed = crc32c(canonical.data(), canonical.size());
  ST_CHECK(stored == computed, "", "the header fails its CRC-32C check (stored ", crc32c_hex(stored), ", computed ",
           crc32c_hex(computed), "): its tensor table, metadata or checksums changed after they were written");
  md->erase(entry);
  if (md->empty()) h.erase(md);
}

void read_metadata(const json& v, Header& out, const std::string& path) {
  ST_CHECK(v.is_object(), "", "__metadata__ must be an object, got ", v.type_name());
  for (auto m = v.begin(); m != v.end(); ++m) {
    ST_CHECK(m.value().is_string(), "", "__metadata__ value of '", printable(m.key()), "' must be a string, got ",
             describe(m.value()));
    out.metadata[m.key()] = m.value().get<std::string>();
  }
}

Entry read_entry(const std::string& name, const json& v, uint64_t data_bytes, const std::string& path) {
  ST_CHECK(!name.empty(), "", "a tensor has an empty name");
  ST_CHECK(v.is_object(), name, "entry must be an object, got ", v.type_name());
  for (auto field = v.begin(); field != v.end(); ++field)
    ST_CHECK(field.key() == "dtype" || field.key() == "shape" || field.key() == "data_offsets", name,
             "unexpected field '", printable(field.key()), "', expected dtype, shape and data_offsets");
  ST_CHECK(v.contains("dtype") && v["dtype"].is_string(), name, "missing or non-string \"dtype\"");
  ST_CHECK(v.contains("shape") && v["shape"].is_array(), name, "missing or non-array \"shape\"");
  ST_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2, name,
           "\"data_offsets\" must be an array [begin, end]");
  Entry e;
  e.name = name;
  const std::string dtype = v["dtype"].get<std::string>();
  try {
    e.dtype = dtype_from_safetensors(dtype);
  } catch (const Error&) {
    ST_CHECK(false, name, "unknown dtype '", printable(dtype), "', expected one of F32 F64 F16 BF16 I64 I32 U8");
  }
  // The product of the non-zero dimensions is bounded as well as numel: an
  // empty tensor's strides are products of its other dimensions and must not overflow.
  uint64_t numel = 1, nonzero = 1;
  for (const json& d : v["shape"]) {
    const uint64_t s = as_offset(d, path, name, "shape");
    ST_CHECK(s <= (uint64_t(1) << 62) && (s == 0 || nonzero <= (uint64_t(1) << 62) / s), name, "shape with ",
             v["shape"].size(), " dimensions is too large");
    if (s != 0) nonzero *= s;
    numel *= s;
    e.shape.push_back(static_cast<int64_t>(s));
  }
  e.begin = as_offset(v["data_offsets"][0], path, name, "data_offsets");
  e.end = as_offset(v["data_offsets"][1], path, name, "data_offsets");
  ST_CHECK(e.begin <= e.end && e.end <= data_bytes, name, "data_offsets [", e.begin, ", ", e.end,
           "] out of range for a data region of ", data_bytes, " bytes",
           e.begin <= e.end ? " (the file ends early: truncated, or its header damaged)" : "");
  // numel <= 2^62 but times the element size may wrap: compare without multiplying.
  const uint64_t esize = element_size(e.dtype);
  ST_CHECK(numel <= data_bytes / esize, name, "shape ", shape_str(e.shape), " of ", dtype, " needs ",
           numel <= UINT64_MAX / esize
               ? std::to_string(numel * esize) + " bytes"
               : std::to_string(numel) + " elements of " + std::to_string(esize) + " bytes",
           ", more than the data region of ", data_bytes, " bytes holds");
  const uint64_t nbytes = numel * esize;
  ST_CHECK(nbytes == e.end - e.begin, name, "shape ", shape_str(e.shape), " of ", dtype, " needs ", nbytes,
           " bytes but data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin);
  return e;
}

// The byte ranges must tile [0, data_bytes): no overlap, no hole, nothing after.
void check_tiling(const Header& h, const std::string& path) {
  std::vector<const Entry*> by_offset;
  for (const Entry& e : h.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Entry* last = nullptr;
  for (const Entry* e : by_offset) {
    ST_CHECK(e->begin >= covered, e->name, "[", e->begin, ", ", e->end, ") overlaps tensor '",
             last ? printable(last->name) : "", "' [", last ? last->begin : 0, ", ", covered, ")");
    ST_CHECK(e->begin == covered, e->name, "hole in the data region: bytes [", covered, ", ", e->begin,
             ") before this tensor belong to no tensor");
    if (e->end > covered || last == nullptr) {
      covered = e->end;
      last = e;
    }
  }
  ST_CHECK(covered == h.data_bytes, "", "the tensors cover ", covered, " bytes of data but the data region holds ",
           h.data_bytes, " bytes");
}

Header read_header(FILE* f, const std::string& path) {
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  TANDEM_CHECK(!ec, "cannot stat safetensors file '", path, "': ", ec.message());
  ST_CHECK(file_size >= 8, "", "the file is too short: ", file_size,
           " bytes, needs at least 8 for the header length");
  uint8_t len_bytes[8];
  read_exact(f, len_bytes, 8, 0, path, "", "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  ST_CHECK(n <= file_size - 8, "", "header length ", n, " is larger than the file after the 8-byte length prefix (",
           file_size - 8, " bytes)");
  ST_CHECK(n <= kMaxHeaderBytes, "", "header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  std::string text(n, '\0');
  read_exact(f, text.data(), n, 8, path, "", "the JSON header");
  json h = parse_header_json(text, path);

  Header out;
  out.data_start = 8 + n;
  out.data_bytes = file_size - 8 - n;
  take_checksums(h, out, path);
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == kMetadataKey)
      read_metadata(it.value(), out, path);
    else
      out.entries.push_back(read_entry(it.key(), it.value(), out.data_bytes, path));
  }
  if (out.has_crcs) {
    for (const Entry& e : out.entries)
      ST_CHECK(out.crcs.count(e.name), e.name, "has no CRC-32C in __metadata__ \"", kChecksumMetadataKey,
               "\" (the checksum table is damaged)");
    ST_CHECK(out.crcs.size() == out.entries.size(), "", "__metadata__ \"", kChecksumMetadataKey,
             "\" names a tensor the file does not hold (the checksum table is damaged)");
  }
  check_tiling(out, path);
  return out;
}

// A file without checksums is named once per process.
void notice_unverified(const Header& h, const std::string& path) {
  if (h.has_crcs) return;
  static std::mutex mu;
  static std::set<std::string> named;
  std::lock_guard<std::mutex> lock(mu);
  if (named.insert(path).second)
    spdlog::warn("safetensors file '{}' carries no CRC-32C checksums (written before Tandem stored them, or by "
                 "another tool): loaded without verifying its bytes; saving it again adds them",
                 path);
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

SafetensorsFile load_safetensors_file(const std::string& path) {
  File file = open_for_read(path);
  Header h = read_header(file.f, path);
  SafetensorsFile contents;
  TensorMap& out = contents.tensors;
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    const uint64_t nbytes = e.end - e.begin;
    read_exact(file.f, t.raw_data(), nbytes, h.data_start + e.begin, path, e.name, "its data");
    if (h.has_crcs) {
      const uint32_t stored = h.crcs.at(e.name), computed = crc32c(t.raw_data(), nbytes);
      ST_CHECK(stored == computed, e.name, "its data fails its CRC-32C check (stored ", crc32c_hex(stored),
               ", computed ", crc32c_hex(computed), "): its bytes changed after it was written");
    }
    out.emplace(e.name, std::move(t));
  }
  notice_unverified(h, path);
  contents.metadata = std::move(h.metadata);
  return contents;
}

TensorMap load_safetensors(const std::string& path) { return load_safetensors_file(path).tensors; }

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  File file = open_for_read(path);
  Header h = read_header(file.f, path);
  notice_unverified(h, path);
  return std::move(h.metadata);
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

  TANDEM_CHECK(!metadata.count(kChecksumMetadataKey), "save_safetensors('", path, "'): the metadata key '",
               kChecksumMetadataKey, "' is the file's own checksum table; name the entry otherwise");
  json h = json::object();
  if (!metadata.empty()) h[kMetadataKey] = metadata;
  json crcs = json::object();
  uint64_t offset = 0;
  for (const Item& it : items) {
    const uint64_t nbytes = it.host.nbytes();
    h[*it.name] = {{"dtype", safetensors_name(it.host.dtype())},
                   {"shape", it.host.shape()},
                   {"data_offsets", {offset, offset + nbytes}}};
    crcs[*it.name] = crc32c_hex(crc32c(it.host.raw_data(), nbytes));
    offset += nbytes;
  }
  std::string text;
  try {
    h[kMetadataKey][kChecksumMetadataKey] = crcs.dump();
    const std::string canonical = h.dump();  // what loading checks "__header__" against (see safetensors.h)
    crcs[kHeaderEntry] = crc32c_hex(crc32c(canonical.data(), canonical.size()));
    h[kMetadataKey][kChecksumMetadataKey] = crcs.dump();
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

#undef ST_CHECK

}  // namespace tandem
