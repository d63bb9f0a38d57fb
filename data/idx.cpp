// IDX reading and writing (see idx.h). Raw files are checked against their
// length before any data is read; gzip files are decompressed straight into the
// result tensor and checked against the decompressed length (a header that
// declares more than deflate's maximum ratio allows for the file's size is
// refused before allocating). Runs on whatever
// thread calls it; touches no shared state.
#include "data/idx.h"

#include <zlib.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

namespace tandem::data {
namespace {

constexpr uint8_t kTypeUByte = 0x08;
constexpr uint64_t kMaxElements = uint64_t(1) << 48;
constexpr uint64_t kMaxDeflateRatio = 1032;  // deflate's largest expansion (zlib's technical notes)

const char* idx_type_name(uint8_t t) {
  switch (t) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return "unknown";
  }
}

std::string hex_bytes(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

// A sequential byte source: a plain file or a gzip stream.
class Reader {
 public:
  virtual ~Reader() = default;
  // Reads up to n bytes; returns fewer only at the end of the (decompressed) data.
  virtual size_t read(void* dst, size_t n) = 0;
};

class RawReader final : public Reader {
 public:
  RawReader(FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  ~RawReader() override { std::fclose(f_); }
  size_t read(void* dst, size_t n) override {
    const size_t got = std::fread(dst, 1, n, f_);
    TANDEM_CHECK(got == n || !std::ferror(f_), "read error in IDX file '", path_,
                 "': ", std::strerror(errno));
    return got;
  }

 private:
  FILE* f_;
  std::string path_;
};

class GzReader final : public Reader {
 public:
  explicit GzReader(std::string path) : path_(std::move(path)) {
    g_ = gzopen(path_.c_str(), "rb");
    TANDEM_CHECK(g_ != nullptr, "cannot open gzip IDX file '", path_, "': ", std::strerror(errno));
    gzbuffer(g_, 1 << 18);
  }
  ~GzReader() override { gzclose(g_); }
  size_t read(void* dst, size_t n) override {
    size_t total = 0;
    char* out = static_cast<char*>(dst);
    while (total < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - total, size_t(1) << 30));
      const int got = gzread(g_, out + total, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(g_, &code);
        TANDEM_FAIL("corrupt gzip data in IDX file '", path_, "': ", msg ? msg : "unknown zlib error");
      }
      if (got == 0) break;
      total += static_cast<size_t>(got);
    }
    return total;
  }
  // zlib's note when the compressed stream itself ended early, else "".
  std::string stream_note() {
    int code = Z_OK;
    const char* msg = gzerror(g_, &code);
    if (code == Z_OK || msg == nullptr) return "";
    return std::string(" (gzip: ") + msg + ")";
  }

 private:
  gzFile g_ = nullptr;
  std::string path_;
};

}  // namespace

Tensor read_idx(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  TANDEM_CHECK(f != nullptr, "cannot open IDX file '", path, "': ", std::strerror(errno));
  uint8_t sig[2] = {0, 0};
  const size_t nsig = std::fread(sig, 1, 2, f);
  const bool gz = nsig == 2 && sig[0] == 0x1f && sig[1] == 0x8b;
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  TANDEM_CHECK(!ec, "cannot stat IDX file '", path, "': ", ec.message());

  std::unique_ptr<Reader> reader;
  GzReader* gzr = nullptr;
  if (gz) {
    std::fclose(f);
    auto g = std::make_unique<GzReader>(path);
    gzr = g.get();
    reader = std::move(g);
  } else {
    std::rewind(f);
    reader = std::make_unique<RawReader>(f, path);
  }
  const char* length_kind = gz ? "decompressed length" : "file length";

  uint8_t magic[4] = {0, 0, 0, 0};
  const size_t nmagic = reader->read(magic, 4);
  TANDEM_CHECK(nmagic == 4, "IDX file '", path, "' is truncated: expected at least 4 header bytes, ",
               length_kind, " is ", nmagic, " bytes");
  TANDEM_CHECK(magic[0] == 0 && magic[1] == 0 && magic[3] >= 1, "bad magic in IDX file '", path,
               "': found bytes ", hex_bytes(magic, 4), ", expected 00 00 08 <ndim >= 1>",
               gz ? " (after gzip decompression)" : "");
  TANDEM_CHECK(magic[2] == kTypeUByte, "IDX file '", path, "' has element type 0x", hex_bytes(magic + 2, 1),
               " (", idx_type_name(magic[2]), "); only 0x08 (unsigned byte) is supported");
  const int ndim = magic[3];

  std::vector<uint8_t> dim_bytes(4 * ndim);
  const size_t header_bytes = 4 + dim_bytes.size();
  const size_t ndims_read = reader->read(dim_bytes.data(), dim_bytes.size());
  TANDEM_CHECK(ndims_read == dim_bytes.size(), "IDX file '", path, "' is truncated: the header of ", ndim,
               " dimensions needs ", header_bytes, " bytes, ", length_kind, " is ", 4 + ndims_read, " bytes");
  Shape shape(ndim);
  uint64_t numel = 1;
  // The product of the non-zero dimensions is bounded too: a shape with a zero
  // in it holds nothing, but its strides are products of the other dimensions
  // and must not overflow (found by fuzz_idx).
  uint64_t nonzero = 1;
  for (int d = 0; d < ndim; ++d) {
    const uint8_t* p = &dim_bytes[4 * d];
    shape[d] = (int64_t(p[0]) << 24) | (int64_t(p[1]) << 16) | (int64_t(p[2]) << 8) | int64_t(p[3]);
    TANDEM_CHECK(shape[d] == 0 || nonzero <= kMaxElements / uint64_t(shape[d]), "IDX file '", path,
                 "' declares an implausibly large shape ", shape_str(shape));
    if (shape[d] != 0) nonzero *= uint64_t(shape[d]);
    numel *= uint64_t(shape[d]);
  }
  const uint64_t expected = header_bytes + numel;

  if (gz) {
    // Deflate expands at most ~1032:1; refuse before allocating what the file cannot hold.
    const uint64_t max_plain = file_size > kMaxElements / kMaxDeflateRatio ? kMaxElements
                                                                           : file_size * kMaxDeflateRatio + 1024;
    TANDEM_CHECK(expected <= max_plain, "IDX file '", path, "' is corrupt: its header declares shape ",
                 shape_str(shape), " (", expected, " bytes), but a gzip file of ", file_size,
                 " bytes cannot hold more than ", max_plain, " bytes");
  } else {
    TANDEM_CHECK(file_size == expected, "IDX file '", path, "' is ",
                 file_size < expected ? "truncated" : "longer than its header says", ": shape ",
                 shape_str(shape), " needs ", expected, " bytes, file length is ", file_size, " bytes");
  }
  Tensor out = Tensor::empty(shape, kUInt8);
  const size_t got = numel ? reader->read(out.raw_data(), numel) : 0;
  if (gz) {
    uint64_t actual = header_bytes + got;
    std::string note = gzr->stream_note();
    if (got == numel) {
      // Count anything after the data so the message can give the real length.
      std::vector<char> sink(1 << 16);
      size_t extra;
      while ((extra = reader->read(sink.data(), sink.size())) > 0) actual += extra;
    }
    TANDEM_CHECK(actual == expected, "IDX file '", path, "' is ",
                 actual < expected ? "truncated" : "longer than its header says", ": shape ",
                 shape_str(shape), " needs ", expected, " bytes, decompressed length is ", actual, " bytes",
                 note);
    // All data arrived, but the compressed stream may still have ended early (a cut CRC/length trailer).
    note = gzr->stream_note();
    TANDEM_CHECK(note.empty(), "IDX file '", path, "' is truncated: the gzip stream ends before its trailer",
                 note);
  } else {
    TANDEM_CHECK(got == numel, "IDX file '", path, "' is truncated: shape ", shape_str(shape), " needs ",
                 expected, " bytes, could read only ", header_bytes + got, " bytes");
  }
  return out;
}

void write_idx(const std::string& path, const Tensor& tensor) {
  TANDEM_CHECK(tensor.defined(), "write_idx('", path, "'): undefined tensor");
  TANDEM_CHECK(tensor.dtype() == kUInt8, "write_idx('", path, "'): IDX holds uint8 here, got ", tensor.str());
  TANDEM_CHECK(tensor.dim() >= 1 && tensor.dim() <= 255, "write_idx('", path,
               "'): needs 1..255 dimensions, got ", tensor.str());
  for (int64_t s : tensor.shape())
    TANDEM_CHECK(s <= int64_t(UINT32_MAX), "write_idx('", path, "'): dimension ", s, " does not fit 32 bits");
  const Tensor host = tensor.to(Device::cpu()).contiguous();
  std::vector<uint8_t> header = {0, 0, kTypeUByte, static_cast<uint8_t>(host.dim())};
  for (int64_t s : host.shape()) {
    const uint32_t v = static_cast<uint32_t>(s);
    for (int shift = 24; shift >= 0; shift -= 8) header.push_back(static_cast<uint8_t>(v >> shift));
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  TANDEM_CHECK(f != nullptr, "cannot create IDX file '", path, "': ", std::strerror(errno));
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  if (ok && host.numel() > 0) ok = std::fwrite(host.raw_data(), 1, host.nbytes(), f) == host.nbytes();
  const int saved_errno = errno;
  ok = (std::fclose(f) == 0) && ok;
  TANDEM_CHECK(ok, "write error on IDX file '", path,
               "': ", std::strerror(saved_errno ? saved_errno : errno));
}

}  // namespace tandem::data
