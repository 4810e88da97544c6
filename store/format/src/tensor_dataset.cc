#include "ckpt/format/tensor_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <unordered_set>
#include <utility>

#include "little_endian.h"

namespace ckpt::format {
namespace {

// The x and y of one split.
struct SplitTensors {
  const TensorView* x = nullptr;
  const TensorView* y = nullptr;
};
// The tensors of each split of the file, by split name.
using Splits = std::map<std::string, SplitTensors>;

}  // namespace

// Fills a TensorDataset (whose members are private) from validated tensors.
class TensorDatasetBuilder {
 public:
  static StatusOr<std::shared_ptr<TensorDataset>> Build(const std::vector<TensorView>& tensors,
                                                        const TensorDatasetOptions& options);
  static void SetMapping(TensorDataset* d, const uint8_t* map, size_t bytes) {
    d->map_ = map;
    d->map_bytes_ = bytes;
  }

 private:
  // The steps of Build, in order; each fills part of `d` or refuses the data.
  static Status SetLayout(const TensorView& tx, const TensorView& ty, TensorDataset* d);
  static Status SetSplits(const Splits& splits, const TensorDatasetOptions& options,
                          TensorDataset* d);
  static Status HoldOutValidation(bool has_val, const TensorView& ty,
                                  const TensorDatasetOptions& options, TensorDataset* d);
  static Status SetNormalization(const TensorDatasetOptions& options, TensorDataset* d);
};

namespace {

constexpr const char* kSplitNames[] = {"train", "val", "test"};
// Largest number of classes accepted from the data.
constexpr int64_t kMaxClasses = int64_t{1} << 24;

using internal::LoadLE16;
using internal::LoadLE32;
using internal::LoadLE64;

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant == 0 ? std::numeric_limits<float>::infinity()
                  : std::numeric_limits<float>::quiet_NaN();
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

// Value `i` of a U8 / F16 / F32 array as a double (U8 as is).
double Element(DType dtype, const uint8_t* base, int64_t i) {
  switch (dtype) {
    case DType::kU8:
      return base[i];
    case DType::kF16:
      return HalfToFloat(LoadLE16(base + 2 * i));
    default: {
      float f;
      std::memcpy(&f, base + 4 * i, 4);
      return f;
    }
  }
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- .npz -----------------------------------------------------------------

// Finds `'key':` in an .npy header dict and returns the text after it.
bool DictValue(std::string_view dict, std::string_view key, std::string_view* rest) {
  const std::string pattern = "'" + std::string(key) + "':";
  const size_t at = dict.find(pattern);
  if (at == std::string_view::npos) return false;
  std::string_view r = dict.substr(at + pattern.size());
  while (!r.empty() && r.front() == ' ') r.remove_prefix(1);
  *rest = r;
  return true;
}

Status ParseNpy(const uint8_t* p, uint64_t size, const std::string& where, TensorView* out) {
  auto bad = [&](const std::string& what) { return Status::Corruption(where + ": " + what); };
  static constexpr uint8_t kMagic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (size < 10 || std::memcmp(p, kMagic, 6) != 0) return bad("not an .npy array (bad magic)");
  const int major = p[6];
  uint64_t header_len;
  uint64_t header_start;
  if (major == 1) {
    header_len = LoadLE16(p + 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return bad("truncated .npy header");
    header_len = LoadLE32(p + 8);
    header_start = 12;
  } else {
    return bad(".npy version " + std::to_string(major) + " is not 1, 2 or 3");
  }
  if (header_len > size - header_start || header_len > (1u << 20)) {
    return bad(".npy header of " + std::to_string(header_len) + " bytes beyond the entry");
  }
  std::string_view dict(reinterpret_cast<const char*>(p + header_start), header_len);
  std::string_view v;
  if (!DictValue(dict, "descr", &v) || v.empty() || v.front() != '\'') {
    return bad(".npy header has no 'descr'");
  }
  const size_t close = v.find('\'', 1);
  if (close == std::string_view::npos) return bad(".npy header: unterminated 'descr'");
  const std::string descr(v.substr(1, close - 1));
  if (descr == "|u1") {
    out->dtype = DType::kU8;
  } else if (descr == "<f2") {
    out->dtype = DType::kF16;
  } else if (descr == "<f4") {
    out->dtype = DType::kF32;
  } else if (descr == "<i8") {
    out->dtype = DType::kI64;
  } else {
    return bad("dtype '" + descr + "' is not |u1 (uint8), <f2, <f4 or <i8 (little-endian)");
  }
  if (!DictValue(dict, "fortran_order", &v)) return bad(".npy header has no 'fortran_order'");
  if (v.substr(0, 4) == "True") return bad("Fortran order is not read (save a C-order array)");
  if (v.substr(0, 5) != "False") return bad(".npy header: bad 'fortran_order'");
  if (!DictValue(dict, "shape", &v) || v.empty() || v.front() != '(') {
    return bad(".npy header has no 'shape' tuple");
  }
  v.remove_prefix(1);
  out->shape.clear();
  uint64_t numel = 1;
  for (;;) {
    while (!v.empty() && (v.front() == ' ' || v.front() == ',')) v.remove_prefix(1);
    if (v.empty()) return bad(".npy header: unterminated 'shape'");
    if (v.front() == ')') break;
    uint64_t d = 0;
    size_t digits = 0;
    while (!v.empty() && v.front() >= '0' && v.front() <= '9') {
      d = d * 10 + static_cast<uint64_t>(v.front() - '0');
      v.remove_prefix(1);
      if (++digits > 15) return bad(".npy header: dimension too large");
    }
    if (digits == 0) return bad(".npy header: bad 'shape'");
    if (out->shape.size() >= static_cast<size_t>(kMaxRank)) {
      return bad("rank above " + std::to_string(kMaxRank));
    }
    if (d != 0 && numel > (uint64_t{1} << 50) / d) return bad("shape product overflows");
    numel *= d;
    out->shape.push_back(static_cast<int64_t>(d));
  }
  const uint64_t data_start = header_start + header_len;
  const uint64_t want = numel * DTypeSize(out->dtype);
  if (size - data_start != want) {
    return bad(std::to_string(size - data_start) + " data bytes, but " +
               std::string(DTypeName(out->dtype)) + " x " + ShapeText(out->shape) + " needs " +
               std::to_string(want));
  }
  out->data = p + data_start;
  out->nbytes = static_cast<size_t>(want);
  return Status::OK();
}

// The bytes of an .npz archive, and the name its errors start with.
struct ZipArchive {
  const uint8_t* p;
  size_t size;
  const std::string& origin;
  Status Bad(const std::string& what) const { return Status::Corruption(origin + ": " + what); }
};

// Where the central directory lies, as the end-of-central-directory record
// (or its ZIP64 form) says.
struct CentralDirectory {
  uint64_t entries = 0;
  uint64_t size = 0;
  uint64_t offset = 0;
};

// One entry of the central directory, its ZIP64 extra field applied.
struct ZipEntry {
  std::string name;
  uint16_t flags = 0;
  uint16_t method = 0;
  uint64_t comp = 0;    // compressed size
  uint64_t uncomp = 0;  // uncompressed size
  uint64_t local = 0;   // offset of its local header
};

// REQUIRES: zip.size >= 22.
StatusOr<CentralDirectory> FindCentralDirectory(const ZipArchive& zip) {
  const uint8_t* p = zip.p;
  const size_t size = zip.size;
  // The end-of-central-directory record: the last 22 bytes unless a comment follows.
  size_t eocd = std::string::npos;
  const size_t lowest = size >= 22 + 65535 ? size - 22 - 65535 : 0;
  for (size_t at = size - 22 + 1; at-- > lowest;) {
    if (LoadLE32(p + at) == 0x06054b50u) {
      eocd = at;
      break;
    }
  }
  if (eocd == std::string::npos) return zip.Bad("not a zip archive (no end of central directory)");
  CentralDirectory cd;
  cd.entries = LoadLE16(p + eocd + 10);
  cd.size = LoadLE32(p + eocd + 12);
  cd.offset = LoadLE32(p + eocd + 16);
  if (cd.entries == 0xFFFF || cd.size == 0xFFFFFFFFu || cd.offset == 0xFFFFFFFFu) {
    // ZIP64: a locator just before the record points at the ZIP64 record.
    if (eocd < 20 || LoadLE32(p + eocd - 20) != 0x07064b50u) {
      return zip.Bad("zip64 archive without its locator");
    }
    const uint64_t z = LoadLE64(p + eocd - 20 + 8);
    if (z > size || size - z < 56 || LoadLE32(p + z) != 0x06064b50u) {
      return zip.Bad("zip64 end of central directory out of bounds");
    }
    cd.entries = LoadLE64(p + z + 32);
    cd.size = LoadLE64(p + z + 40);
    cd.offset = LoadLE64(p + z + 48);
  }
  if (cd.offset > size || cd.size > size - cd.offset) {
    return zip.Bad("central directory beyond the file of " + std::to_string(size) + " bytes");
  }
  if (cd.entries > cd.size / 46) return zip.Bad("central directory claims too many entries");
  return cd;
}

// The ZIP64 extra field of `entry` in the extra fields [x, x_end): the 64-bit
// values of the fields that read 0xFFFFFFFF, in order.
Status ApplyZip64Extra(const ZipArchive& zip, const uint8_t* x, const uint8_t* x_end,
                       ZipEntry* entry) {
  while (x_end - x >= 4) {
    const uint16_t id = LoadLE16(x);
    const uint16_t len = LoadLE16(x + 2);
    if (x_end - x - 4 < len) return zip.Bad(entry->name + ": bad zip extra field");
    if (id == 0x0001) {
      const uint8_t* v = x + 4;
      const uint8_t* v_end = v + len;
      for (uint64_t* field : {&entry->uncomp, &entry->comp, &entry->local}) {
        if (*field != 0xFFFFFFFFu) continue;
        if (v_end - v < 8) return zip.Bad(entry->name + ": short zip64 extra field");
        *field = LoadLE64(v);
        v += 8;
      }
    }
    x += 4 + len;
  }
  return Status::OK();
}

// Entry `e` of the central directory at `*at`; moves `*at` past it.
Status ReadDirectoryEntry(const ZipArchive& zip, const CentralDirectory& cd, uint64_t e,
                          uint64_t* at, ZipEntry* entry) {
  const uint8_t* p = zip.p;
  const uint64_t cd_end = cd.offset + cd.size;
  const uint64_t pos = *at;
  if (cd_end - pos < 46 || LoadLE32(p + pos) != 0x02014b50u) {
    return zip.Bad("bad central directory entry " + std::to_string(e));
  }
  entry->flags = LoadLE16(p + pos + 8);
  entry->method = LoadLE16(p + pos + 10);
  entry->comp = LoadLE32(p + pos + 20);
  entry->uncomp = LoadLE32(p + pos + 24);
  const uint64_t name_len = LoadLE16(p + pos + 28);
  const uint64_t extra_len = LoadLE16(p + pos + 30);
  const uint64_t comment_len = LoadLE16(p + pos + 32);
  entry->local = LoadLE32(p + pos + 42);
  if (cd_end - pos - 46 < name_len + extra_len + comment_len) {
    return zip.Bad("central directory entry " + std::to_string(e) + " runs past the directory");
  }
  entry->name.assign(reinterpret_cast<const char*>(p + pos + 46), name_len);
  const uint8_t* extra = p + pos + 46 + name_len;
  CKPT_RETURN_IF_ERROR(ApplyZip64Extra(zip, extra, extra + extra_len, entry));
  *at = pos + 46 + name_len + extra_len + comment_len;
  return Status::OK();
}

// Where the bytes of `entry` start: a stored (uncompressed, unencrypted)
// entry whose local header and bytes lie within the archive.
Status LocateStoredData(const ZipArchive& zip, const ZipEntry& entry, uint64_t* data_start) {
  const uint8_t* p = zip.p;
  const size_t size = zip.size;
  const std::string& name = entry.name;
  if (entry.flags & 1) return zip.Bad(name + ": encrypted zip entry");
  if (entry.method != 0) {
    return zip.Bad(name + ": compressed zip entry (method " + std::to_string(entry.method) +
                   "): write the archive with np.savez, not np.savez_compressed");
  }
  if (entry.comp != entry.uncomp) return zip.Bad(name + ": stored entry whose sizes differ");
  const uint64_t local = entry.local;
  if (local > size || size - local < 30 || LoadLE32(p + local) != 0x04034b50u) {
    return zip.Bad(name + ": local header out of bounds");
  }
  const uint64_t start = local + 30 + LoadLE16(p + local + 26) + LoadLE16(p + local + 28);
  if (start > size || entry.comp > size - start) {
    return zip.Bad(name + ": " + std::to_string(entry.comp) + " bytes beyond the file of " +
                   std::to_string(size) + " bytes");
  }
  *data_start = start;
  return Status::OK();
}

// ---- validation -----------------------------------------------------------

Status CheckFinite(const std::string& origin, const TensorView& t, int64_t row_elems) {
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    bool finite;
    if (t.dtype == DType::kF16) {
      finite = (LoadLE16(t.data + 2 * i) & 0x7C00) != 0x7C00;
    } else {
      finite = (LoadLE32(t.data + 4 * i) & 0x7F800000u) != 0x7F800000u;
    }
    if (!finite) {
      const double v = Element(t.dtype, t.data, i);
      return Status::Corruption(origin + ": " + t.name + ": " +
                                (std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf")) + " at row " +
                                std::to_string(row_elems > 0 ? i / row_elems : 0));
    }
  }
  return Status::OK();
}

Status BadTensor(const std::string& origin, const std::string& tensor, const std::string& what) {
  return Status::Corruption(origin + ": " + tensor + ": " + what);
}

// Each tensor is the x or y of a known split, each split has both, and there
// is a train split.
StatusOr<Splits> GroupSplits(const std::vector<TensorView>& tensors, const std::string& origin) {
  Splits splits;
  for (const TensorView& t : tensors) {
    bool known = false;
    for (const char* s : kSplitNames) {
      if (t.name == std::string(s) + ".x") {
        splits[s].x = &t;
        known = true;
      } else if (t.name == std::string(s) + ".y") {
        splits[s].y = &t;
        known = true;
      }
    }
    if (!known) {
      return BadTensor(origin, t.name,
                       "unknown tensor (expected train.x, train.y, and optionally val.x, val.y, "
                       "test.x, test.y)");
    }
  }
  for (const char* s : kSplitNames) {
    auto it = splits.find(s);
    if (it == splits.end()) continue;
    const std::string split(s);
    if (it->second.x == nullptr) {
      return BadTensor(origin, split + ".x", "missing (" + split + ".y is there)");
    }
    if (it->second.y == nullptr) {
      return BadTensor(origin, split + ".y", "missing (" + split + ".x is there)");
    }
  }
  if (splits.count("train") == 0) {
    return Status::Corruption(origin + ": train.x: missing (the file has no train split)");
  }
  return splits;
}

// A split's x and y have train's dtypes and shapes after N, and as many rows.
Status CheckSplitMatchesTrain(const std::string& origin, const SplitTensors& split,
                              const SplitTensors& train) {
  const TensorView& x = *split.x;
  const TensorView& y = *split.y;
  const TensorView& tx = *train.x;
  const TensorView& ty = *train.y;
  if (x.dtype != tx.dtype) {
    return BadTensor(origin, x.name,
                     "dtype " + std::string(DTypeName(x.dtype)) + " differs from train.x's " +
                         std::string(DTypeName(tx.dtype)));
  }
  if (x.shape.size() != tx.shape.size() ||
      !std::equal(x.shape.begin() + 1, x.shape.end(), tx.shape.begin() + 1)) {
    return BadTensor(
        origin, x.name,
        "shape " + ShapeText(x.shape) + " does not match train.x's " + ShapeText(tx.shape));
  }
  if (y.dtype != ty.dtype || y.shape.size() != ty.shape.size() ||
      !std::equal(y.shape.begin() + 1, y.shape.end(), ty.shape.begin() + 1)) {
    return BadTensor(origin, y.name,
                     std::string(DTypeName(y.dtype)) + " " + ShapeText(y.shape) +
                         " does not match train.y's " + std::string(DTypeName(ty.dtype)) + " " +
                         ShapeText(ty.shape));
  }
  if (x.shape[0] != y.shape[0]) {
    return BadTensor(
        origin, y.name,
        std::to_string(y.shape[0]) + " rows, but " + x.name + " has " + std::to_string(x.shape[0]));
  }
  return Status::OK();
}

// Every label of I64 [N] `y` is in [0, limit); raises *max_label to the
// largest.
Status CheckLabels(const std::string& origin, const TensorView& y, int64_t limit,
                   int64_t* max_label) {
  for (int64_t r = 0; r < y.shape[0]; ++r) {
    const int64_t label = static_cast<int64_t>(LoadLE64(y.data + 8 * r));
    if (label < 0 || label >= limit) {
      return BadTensor(origin, y.name,
                       "label " + std::to_string(label) + " at row " + std::to_string(r) +
                           " is outside [0, " + std::to_string(limit) + ")");
    }
    *max_label = std::max(*max_label, label);
  }
  return Status::OK();
}

// Normalization given in the options: one finite mean and one finite std > 0
// per channel.
Status CheckGivenNormalization(const std::string& origin, int64_t channels,
                               const TensorDatasetOptions& options) {
  if (options.mean.size() != static_cast<size_t>(channels) ||
      options.std.size() != static_cast<size_t>(channels)) {
    return Status::InvalidArgument(origin + ": mean and std need " + std::to_string(channels) +
                                   " values each (one per channel), got " +
                                   std::to_string(options.mean.size()) + " and " +
                                   std::to_string(options.std.size()));
  }
  for (size_t c = 0; c < options.std.size(); ++c) {
    if (!(options.std[c] > 0) || !std::isfinite(options.std[c]) ||
        !std::isfinite(options.mean[c])) {
      return Status::InvalidArgument(origin + ": std[" + std::to_string(c) +
                                     "] must be finite and > 0, mean finite");
    }
  }
  return Status::OK();
}

// The train split's rows of x that the statistics are taken over.
struct TrainRows {
  DType dtype;
  const uint8_t* base;
  int64_t count;        // rows
  int64_t sample;       // elements per row
  int64_t per_channel;  // elements per channel in a row: H * W, or 1 for features
};

// The mean and the mean of squares of channel `c`'s values (U8 as value /
// 255: integer sums, then double).
std::pair<double, double> ChannelMoments(const TrainRows& rows, int64_t c) {
  const double count = static_cast<double>(rows.count) * static_cast<double>(rows.per_channel);
  if (rows.dtype == DType::kU8) {
    const double unit = 255.0;
    uint64_t sum = 0, sum_sq = 0;
    for (int64_t r = 0; r < rows.count; ++r) {
      const uint8_t* q = rows.base + r * rows.sample + c * rows.per_channel;
      for (int64_t i = 0; i < rows.per_channel; ++i) {
        sum += q[i];
        sum_sq += uint64_t{q[i]} * q[i];
      }
    }
    return {static_cast<double>(sum) / (count * unit),
            static_cast<double>(sum_sq) / (count * unit * unit)};
  }
  double sum = 0, sum_sq = 0;
  for (int64_t r = 0; r < rows.count; ++r) {
    const int64_t first = r * rows.sample + c * rows.per_channel;
    for (int64_t i = 0; i < rows.per_channel; ++i) {
      const double v = Element(rows.dtype, rows.base, first + i);
      sum += v;
      sum_sq += v * v;
    }
  }
  return {sum / count, sum_sq / count};
}

}  // namespace

std::string_view DatasetFormatName(DatasetFormat format) {
  switch (format) {
    case DatasetFormat::kIdx:
      return "idx";
    case DatasetFormat::kSafetensors:
      return "safetensors";
    case DatasetFormat::kNpz:
      return "npz";
  }
  return "?";
}

StatusOr<DatasetFormat> ParseDatasetFormat(std::string_view name) {
  for (DatasetFormat f : {DatasetFormat::kIdx, DatasetFormat::kSafetensors, DatasetFormat::kNpz}) {
    if (name == DatasetFormatName(f)) return f;
  }
  return Status::InvalidArgument("unknown dataset format \"" + std::string(name) +
                                 "\" (expected idx, safetensors or npz)");
}

int64_t TensorDataset::sample_numel() const {
  int64_t n = 1;
  for (int64_t d : sample_shape_) n *= d;
  return n;
}

TensorDataset::~TensorDataset() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

StatusOr<std::vector<TensorView>> ParseNpz(const void* data, size_t size,
                                           const std::string& origin) {
  const ZipArchive zip{static_cast<const uint8_t*>(data), size, origin};
  if (size < 22) return zip.Bad("not a zip archive (shorter than 22 bytes)");
  CKPT_ASSIGN_OR_RETURN(const CentralDirectory cd, FindCentralDirectory(zip));
  std::vector<TensorView> out;
  // Names seen, for the duplicate check in O(1) each: an archive may hold
  // tens of thousands of entries, and a pairwise scan of 64 k took 3 s.
  std::unordered_set<std::string> names;
  uint64_t at = cd.offset;
  for (uint64_t e = 0; e < cd.entries; ++e) {
    ZipEntry entry;
    CKPT_RETURN_IF_ERROR(ReadDirectoryEntry(zip, cd, e, &at, &entry));
    uint64_t data_start = 0;
    CKPT_RETURN_IF_ERROR(LocateStoredData(zip, entry, &data_start));
    constexpr std::string_view kNpy = ".npy";
    const std::string& name = entry.name;
    if (name.size() <= kNpy.size() || name.compare(name.size() - kNpy.size(), kNpy.size(), kNpy)) {
      return zip.Bad(name + ": not an .npy entry");
    }
    TensorView t;
    t.name = name.substr(0, name.size() - kNpy.size());
    if (!names.insert(t.name).second) return zip.Bad(t.name + ": two entries of that name");
    CKPT_RETURN_IF_ERROR(ParseNpy(zip.p + data_start, entry.comp, origin + ": " + t.name, &t));
    out.push_back(std::move(t));
  }
  return out;
}

StatusOr<std::shared_ptr<TensorDataset>> TensorDatasetBuilder::Build(
    const std::vector<TensorView>& tensors, const TensorDatasetOptions& options) {
  CKPT_ASSIGN_OR_RETURN(const Splits splits, GroupSplits(tensors, options.path));
  auto d = std::shared_ptr<TensorDataset>(new TensorDataset());
  d->path_ = options.path;
  const SplitTensors& train = splits.at("train");
  CKPT_RETURN_IF_ERROR(SetLayout(*train.x, *train.y, d.get()));
  CKPT_RETURN_IF_ERROR(SetSplits(splits, options, d.get()));
  CKPT_RETURN_IF_ERROR(HoldOutValidation(splits.count("val") != 0, *train.y, options, d.get()));
  CKPT_RETURN_IF_ERROR(SetNormalization(options, d.get()));
  return d;
}

Status TensorDatasetBuilder::SetLayout(const TensorView& tx, const TensorView& ty,
                                       TensorDataset* d) {
  const std::string& origin = d->path_;
  if (tx.dtype != DType::kU8 && tx.dtype != DType::kF16 && tx.dtype != DType::kF32) {
    return BadTensor(origin, tx.name,
                     "dtype " + std::string(DTypeName(tx.dtype)) + " is not U8, F16 or F32");
  }
  if (tx.shape.size() != 2 && tx.shape.size() != 4) {
    return BadTensor(origin, tx.name,
                     "shape " + ShapeText(tx.shape) + " is neither [N, C, H, W] nor [N, F]");
  }
  d->x_dtype_ = tx.dtype;
  d->sample_shape_.assign(tx.shape.begin() + 1, tx.shape.end());
  for (int64_t dim : d->sample_shape_) {
    if (dim < 1) {
      return BadTensor(origin, tx.name, "shape " + ShapeText(tx.shape) + " has an empty sample");
    }
  }
  if (ty.dtype == DType::kI64 && ty.shape.size() == 1) {
    d->target_ = TargetKind::kClasses;
  } else if (ty.dtype == DType::kF32 && (ty.shape.size() == 1 || ty.shape.size() == 2)) {
    d->target_ = TargetKind::kValues;
    d->target_rank_ = static_cast<int>(ty.shape.size());
    d->target_width_ = ty.shape.size() == 2 ? ty.shape[1] : 1;
    if (d->target_width_ < 1) {
      return BadTensor(origin, ty.name, "shape " + ShapeText(ty.shape) + " is empty");
    }
  } else {
    return BadTensor(origin, ty.name,
                     std::string(DTypeName(ty.dtype)) + " " + ShapeText(ty.shape) +
                         " is neither I64 [N] class labels nor F32 [N] or [N, T] targets");
  }
  return Status::OK();
}

Status TensorDatasetBuilder::SetSplits(const Splits& splits, const TensorDatasetOptions& options,
                                       TensorDataset* d) {
  const std::string& origin = d->path_;
  const SplitTensors& train = splits.at("train");
  const int64_t label_limit = options.classes > 0 ? options.classes : kMaxClasses;
  int64_t max_label = -1;
  for (const char* s : kSplitNames) {
    auto it = splits.find(s);
    if (it == splits.end()) continue;
    const TensorView& x = *it->second.x;
    const TensorView& y = *it->second.y;
    CKPT_RETURN_IF_ERROR(CheckSplitMatchesTrain(origin, it->second, train));
    if (x.dtype != DType::kU8) CKPT_RETURN_IF_ERROR(CheckFinite(origin, x, d->sample_numel()));
    if (d->target_ == TargetKind::kValues) {
      CKPT_RETURN_IF_ERROR(CheckFinite(origin, y, d->target_width_));
    } else {
      CKPT_RETURN_IF_ERROR(CheckLabels(origin, y, label_limit, &max_label));
    }
    const TensorSplit split{x.shape[0], x.data, y.data};
    if (std::string(s) == "train") d->train_ = split;
    if (std::string(s) == "val") d->validation_ = split;
    if (std::string(s) == "test") d->test_ = split;
  }
  if (d->target_ == TargetKind::kClasses) {
    d->num_classes_ = options.classes > 0 ? options.classes : max_label + 1;
    if (d->num_classes_ < 2) {
      return Status::InvalidArgument(origin + ": train.y: every label is " +
                                     std::to_string(max_label) +
                                     "; a classification needs at least 2 classes");
    }
  }
  return Status::OK();
}

Status TensorDatasetBuilder::HoldOutValidation(bool has_val, const TensorView& ty,
                                               const TensorDatasetOptions& options,
                                               TensorDataset* d) {
  const std::string& origin = d->path_;
  if (has_val) {
    if (options.val_size != 0) {
      return Status::InvalidArgument(
          origin + ": has a val split; val_size = " + std::to_string(options.val_size) +
          " applies only without one");
    }
    return Status::OK();
  }
  if (options.val_size < 1 || options.val_size >= d->train_.count) {
    return Status::InvalidArgument(origin + ": has no val split, so val_size must hold out 1 to " +
                                   std::to_string(d->train_.count - 1) + " of train's " +
                                   std::to_string(d->train_.count) + " rows (it is " +
                                   std::to_string(options.val_size) + ")");
  }
  const size_t x_row = static_cast<size_t>(d->sample_numel()) * DTypeSize(d->x_dtype_);
  const size_t y_row = static_cast<size_t>(d->target_width_) * DTypeSize(ty.dtype);
  const int64_t keep = d->train_.count - options.val_size;
  d->validation_.count = options.val_size;
  d->validation_.x = static_cast<const uint8_t*>(d->train_.x) + keep * x_row;
  d->validation_.y = static_cast<const uint8_t*>(d->train_.y) + keep * y_row;
  d->train_.count = keep;
  return Status::OK();
}

Status TensorDatasetBuilder::SetNormalization(const TensorDatasetOptions& options,
                                              TensorDataset* d) {
  const int64_t channels = d->sample_shape_[0];
  if (!options.mean.empty() || !options.std.empty()) {
    CKPT_RETURN_IF_ERROR(CheckGivenNormalization(d->path_, channels, options));
    d->mean_ = options.mean;
    d->stddev_ = options.std;
  } else {
    const int64_t sample = d->sample_numel();
    const TrainRows rows{d->x_dtype_, static_cast<const uint8_t*>(d->train_.x), d->train_.count,
                         sample, sample / channels};
    d->mean_.assign(static_cast<size_t>(channels), 0);
    d->stddev_.assign(static_cast<size_t>(channels), 1);
    for (int64_t c = 0; c < channels; ++c) {
      const auto [mean, mean_sq] = ChannelMoments(rows, c);
      d->mean_[c] = mean;
      d->stddev_[c] = std::sqrt(std::max(mean_sq - mean * mean, 1e-12));
    }
  }
  const double unit = d->x_dtype_ == DType::kU8 ? 255.0 : 1.0;
  for (int64_t c = 0; c < channels; ++c) {
    d->scale_.push_back(1.0 / (unit * d->stddev_[c]));
    d->shift_.push_back(-d->mean_[c] / d->stddev_[c]);
  }
  return Status::OK();
}

StatusOr<std::shared_ptr<const TensorDataset>> ValidateTensorDataset(
    const std::vector<TensorView>& tensors, const TensorDatasetOptions& options) {
  CKPT_ASSIGN_OR_RETURN(auto d, TensorDatasetBuilder::Build(tensors, options));
  return std::shared_ptr<const TensorDataset>(std::move(d));
}

StatusOr<std::shared_ptr<const TensorDataset>> TensorDataset::Open(
    const TensorDatasetOptions& options) {
  const std::string& path = options.path;
  if (options.format != DatasetFormat::kSafetensors && options.format != DatasetFormat::kNpz) {
    return Status::InvalidArgument(path + ": format " +
                                   std::string(DatasetFormatName(options.format)) +
                                   " is not a tensor file (safetensors or npz)");
  }
  // Opened as RegularFile opens a model file: a final symbolic link is
  // refused, and a FIFO or a device does not block the open.
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(path + ": no such file");
    if (err == ELOOP) {
      return Status::InvalidArgument(path + " is a symbolic link (refused: name the file itself)");
    }
    return Status::IOError(path + ": " + std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::IOError(path + ": not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return Status::Corruption(path + ": empty file");
  }
  // MAP_PRIVATE, read-only: every worker on the host shares the page cache.
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) return Status::IOError(path + ": mmap: " + std::strerror(map_err));
  const auto* bytes = static_cast<const uint8_t*>(map);

  std::vector<TensorView> tensors;
  if (options.format == DatasetFormat::kSafetensors) {
    SafetensorsOptions st_options;
    st_options.origin = path;
    auto file = ParseSafetensors(bytes, size, st_options);
    if (!file.ok()) {
      ::munmap(map, size);
      return file.status();
    }
    tensors = std::move(file->tensors);
  } else {
    auto arrays = ParseNpz(bytes, size, path);
    if (!arrays.ok()) {
      ::munmap(map, size);
      return arrays.status();
    }
    tensors = std::move(arrays).value();
  }
  auto built = TensorDatasetBuilder::Build(tensors, options);
  if (!built.ok()) {
    ::munmap(map, size);
    return built.status();
  }
  TensorDatasetBuilder::SetMapping(built->get(), bytes, size);
  return std::shared_ptr<const TensorDataset>(std::move(built).value());
}

}  // namespace ckpt::format
