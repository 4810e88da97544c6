#include "ckpt/model/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

namespace ckpt::model {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
// An IDX file larger than this is refused (the MNIST family is ~47 MB unpacked).
// The largest IDX file's elements (docs/LIMITS.md): EMNIST's largest split
// is 0.64 GB; a file that says more is refused before anything is read.
constexpr size_t kMaxIdxBytes = size_t{1} << 30;
// Elements are read in steps of this many bytes, so that memory follows what
// the file holds, never what its header claims (a 20-byte file may claim a
// GiB; a gzip bomb may decompress to one).
constexpr size_t kIdxReadStep = size_t{64} << 20;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Sequential reads of a plain or gzipped file, for ReadIdxFile.
class IdxReader {
 public:
  IdxReader(const IdxReader&) = delete;
  IdxReader& operator=(const IdxReader&) = delete;
  ~IdxReader() {
    if (gz_ != nullptr) gzclose(gz_);
    if (plain_ != nullptr) std::fclose(plain_);
  }

  static StatusOr<std::unique_ptr<IdxReader>> Open(const std::string& path) {
    if (!FileExists(path)) return Status::NotFound(path + ": no such file");
    std::unique_ptr<IdxReader> r(new IdxReader(path));
    if (EndsWith(path, ".gz")) {
      r->gz_ = gzopen(path.c_str(), "rb");
      if (r->gz_ == nullptr) return Status::IOError(path + ": cannot open");
      gzbuffer(r->gz_, 1 << 17);
    } else {
      r->plain_ = std::fopen(path.c_str(), "rb");
      if (r->plain_ == nullptr) {
        if (errno == ENOENT) return Status::NotFound(path + ": no such file");
        return Status::IOError(path + ": " + std::strerror(errno));
      }
    }
    return r;
  }

  // Reads up to n bytes into dst; returns how many (fewer only at the end).
  StatusOr<size_t> Read(void* dst, size_t n) {
    auto* out = static_cast<uint8_t*>(dst);
    size_t done = 0;
    while (done < n) {
      if (gz_ != nullptr) {
        // gzread takes an unsigned count: at most 1 GiB per call.
        const unsigned want = static_cast<unsigned>(std::min<size_t>(n - done, size_t{1} << 30));
        const int got = gzread(gz_, out + done, want);
        if (got < 0) {
          int errnum = 0;
          return Status::IOError(path_ + ": gunzip failed: " + gzerror(gz_, &errnum));
        }
        if (got == 0) break;
        done += static_cast<size_t>(got);
      } else {
        const size_t got = std::fread(out + done, 1, n - done, plain_);
        if (got == 0) {
          if (std::ferror(plain_) != 0) return Status::IOError(path_ + ": read error");
          break;
        }
        done += got;
      }
    }
    return done;
  }

 private:
  explicit IdxReader(std::string path) : path_(std::move(path)) {}
  std::string path_;
  gzFile gz_ = nullptr;
  FILE* plain_ = nullptr;
};

// Reads up to `want` bytes into `*out` (appended), growing it a step at a
// time: it never holds more than what was read plus one step. The number of
// bytes appended; fewer than `want` only at the end of the file.
StatusOr<uint64_t> ReadGrowing(IdxReader* reader, uint64_t want, std::vector<uint8_t>* out) {
  uint64_t done = 0;
  while (done < want) {
    const size_t step = static_cast<size_t>(std::min<uint64_t>(want - done, kIdxReadStep));
    const size_t before = out->size();
    out->resize(before + step);
    CKPT_ASSIGN_OR_RETURN(size_t got, reader->Read(out->data() + before, step));
    out->resize(before + got);
    done += got;
    if (got < step) break;
  }
  return done;
}

uint32_t LoadBE32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Finds `base` or `base.gz` in `dir`.
StatusOr<IdxArray> ReadFromDir(const std::string& dir, const std::string& base,
                               int64_t tail_rows = 0) {
  std::string plain = dir + "/" + base;
  if (FileExists(plain)) return ReadIdxFile(plain, tail_rows);
  return ReadIdxFile(plain + ".gz", tail_rows);
}

}  // namespace

// The elements are read straight into the arrays, grown as the file yields
// them (never sized from the header alone, which is untrusted): no copy of the
// file in between (the Fashion-MNIST train images are 47 MB).
StatusOr<IdxArray> ReadIdxFile(const std::string& path, int64_t tail_rows) {
  CKPT_ASSIGN_OR_RETURN(auto reader, IdxReader::Open(path));
  uint8_t head[4 + 4 * 4];
  CKPT_ASSIGN_OR_RETURN(size_t got, reader->Read(head, 4));
  if (got < 4 || head[0] != 0 || head[1] != 0) {
    return Status::Corruption(path + ": not an IDX file (bad magic)");
  }
  if (head[2] != 0x08) {
    return Status::Corruption(path + ": IDX element type " + std::to_string(head[2]) +
                              " is not u8 (0x08)");
  }
  const int rank = head[3];
  if (rank < 1 || rank > 4) {
    return Status::Corruption(path + ": IDX rank " + std::to_string(rank) + " not in 1..4");
  }
  CKPT_ASSIGN_OR_RETURN(got, reader->Read(head + 4, 4 * static_cast<size_t>(rank)));
  if (got < 4 * static_cast<size_t>(rank)) {
    return Status::Corruption(path + ": truncated IDX header");
  }
  IdxArray out;
  uint64_t count = 1;
  for (int i = 0; i < rank; ++i) {
    uint32_t d = LoadBE32(head + 4 + 4 * i);
    out.dims.push_back(d);
    count *= d;
    if (count > kMaxIdxBytes) return Status::Corruption(path + ": IDX dimensions too large");
  }
  const uint64_t rows = static_cast<uint64_t>(out.dims[0]);
  const uint64_t per_row = rows == 0 ? 0 : count / rows;
  const uint64_t tail =
      std::min<uint64_t>(rows, static_cast<uint64_t>(std::max<int64_t>(0, tail_rows)));
  const uint64_t head_bytes = count - tail * per_row;
  CKPT_ASSIGN_OR_RETURN(uint64_t held, ReadGrowing(reader.get(), head_bytes, &out.data));
  if (held == head_bytes && tail > 0) {
    CKPT_ASSIGN_OR_RETURN(uint64_t tail_got, ReadGrowing(reader.get(), tail * per_row, &out.tail));
    held += tail_got;
  }
  got = held;
  if (got == count) {
    // Anything after the last element is an error too; count it for the message.
    uint8_t rest[1 << 12];
    do {
      CKPT_ASSIGN_OR_RETURN(got, reader->Read(rest, sizeof rest));
      held += got;
    } while (got > 0 && held <= kMaxIdxBytes);
  }
  if (held != count) {
    return Status::Corruption(path + ": IDX holds " + std::to_string(held) +
                              " elements, dimensions say " + std::to_string(count));
  }
  return out;
}

StatusOr<std::string> DefaultDatasetDir(const std::string& name) {
  if (name == "fashion-mnist") return std::string("/usr/share/datasets/fashion-mnist");
  if (name == "mnist") return std::string("/usr/share/datasets/mnist");
  return Status::InvalidArgument("unknown dataset \"" + name +
                                 "\" (known: fashion-mnist, mnist; or give its directory)");
}

StatusOr<std::shared_ptr<const DatasetSplits>> LoadDataset(const std::string& name,
                                                           const std::string& dir_in) {
  std::string dir = dir_in;
  if (dir.empty()) {
    CKPT_ASSIGN_OR_RETURN(dir, DefaultDatasetDir(name));
  }
  // The validation split is the train file's last kValidationSize rows.
  CKPT_ASSIGN_OR_RETURN(IdxArray train_x,
                        ReadFromDir(dir, "train-images-idx3-ubyte", kValidationSize));
  CKPT_ASSIGN_OR_RETURN(IdxArray train_y,
                        ReadFromDir(dir, "train-labels-idx1-ubyte", kValidationSize));
  CKPT_ASSIGN_OR_RETURN(IdxArray test_x, ReadFromDir(dir, "t10k-images-idx3-ubyte"));
  CKPT_ASSIGN_OR_RETURN(IdxArray test_y, ReadFromDir(dir, "t10k-labels-idx1-ubyte"));

  auto check_images = [&](const IdxArray& x, const IdxArray& y, const char* which) -> Status {
    if (x.dims.size() != 3 && x.dims.size() != 4) {
      return Status::Corruption(dir + ": " + which + " images must have rank 3 or 4");
    }
    if (y.dims.size() != 1)
      return Status::Corruption(dir + ": " + which + " labels must have rank 1");
    if (x.dims[0] != y.dims[0]) {
      return Status::Corruption(dir + ": " + which + " has " + std::to_string(x.dims[0]) +
                                " images but " + std::to_string(y.dims[0]) + " labels");
    }
    for (size_t i = 1; i < x.dims.size(); ++i) {
      if (x.dims[i] == 0) return Status::Corruption(dir + ": " + which + " images are empty");
    }
    return Status::OK();
  };
  CKPT_RETURN_IF_ERROR(check_images(train_x, train_y, "train"));
  CKPT_RETURN_IF_ERROR(check_images(test_x, test_y, "t10k"));
  if (std::vector<int64_t>(train_x.dims.begin() + 1, train_x.dims.end()) !=
      std::vector<int64_t>(test_x.dims.begin() + 1, test_x.dims.end())) {
    return Status::Corruption(dir + ": test images differ in shape from train images");
  }
  const int64_t n_all = train_x.dims[0];
  if (n_all <= kValidationSize) {
    return Status::Corruption(dir + ": the train file has " + std::to_string(n_all) +
                              " images, not more than the " + std::to_string(kValidationSize) +
                              " held out for validation");
  }

  // The arrays the rows were read into stay where they are: one copy of the images.
  struct IdxStorage {
    IdxArray train_x, train_y, test_x, test_y;
  };
  auto store = std::make_shared<IdxStorage>();
  store->train_x = std::move(train_x);
  store->train_y = std::move(train_y);
  store->test_x = std::move(test_x);
  store->test_y = std::move(test_y);

  auto ds = std::make_shared<DatasetSplits>();
  ds->name = name;
  const std::vector<int64_t>& dims = store->train_x.dims;
  if (dims.size() == 4) {
    ds->sample_shape = {dims[1], dims[2], dims[3]};
  } else {
    ds->sample_shape = {1, dims[1], dims[2]};
  }
  ds->x_dtype = format::DType::kU8;
  ds->y_dtype = format::DType::kU8;
  ds->target = format::TargetKind::kClasses;
  const int64_t n_train = n_all - kValidationSize;
  ds->train = {n_train, store->train_x.data.data(), store->train_y.data.data()};
  ds->validation = {kValidationSize, store->train_x.tail.data(), store->train_y.tail.data()};
  ds->test = {store->test_x.dims[0], store->test_x.data.data(), store->test_y.data.data()};

  int max_label = 0;
  for (const auto* labels : {&store->train_y.data, &store->train_y.tail, &store->test_y.data}) {
    for (uint8_t l : *labels) max_label = l > max_label ? l : max_label;
  }
  ds->num_classes = max_label + 1;

  uint64_t sum = 0;
  uint64_t sum_sq = 0;
  for (uint8_t v : store->train_x.data) {
    sum += v;
    sum_sq += uint64_t{v} * v;
  }
  const double count = static_cast<double>(store->train_x.data.size());
  const double mean = static_cast<double>(sum) / (count * 255.0);
  const double mean_sq = static_cast<double>(sum_sq) / (count * 255.0 * 255.0);
  const double stddev = std::sqrt(std::max(mean_sq - mean * mean, 1e-12));
  // One statistic over all channels (the MNIST family has one).
  const size_t channels = static_cast<size_t>(ds->sample_shape[0]);
  ds->mean.assign(channels, mean);
  ds->stddev.assign(channels, stddev);
  ds->scale.assign(channels, 1.0 / (255.0 * stddev));
  ds->shift.assign(channels, -mean / stddev);
  ds->storage = std::move(store);
  return std::shared_ptr<const DatasetSplits>(std::move(ds));
}

int64_t DatasetSplits::sample_numel() const {
  int64_t n = 1;
  for (int64_t d : sample_shape) n *= d;
  return n;
}

StatusOr<std::shared_ptr<const DatasetSplits>> LoadTensorDataset(
    const format::TensorDatasetOptions& options) {
  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const format::TensorDataset> file,
                        format::TensorDataset::Open(options));
  auto ds = std::make_shared<DatasetSplits>();
  ds->name = file->path();
  ds->x_dtype = file->x_dtype();
  ds->sample_shape = file->sample_shape();
  ds->target = file->target();
  ds->y_dtype =
      file->target() == format::TargetKind::kClasses ? format::DType::kI64 : format::DType::kF32;
  ds->target_width = file->target_width();
  ds->num_classes = file->num_classes();
  auto split = [](const format::TensorSplit& s) { return DataSplit{s.count, s.x, s.y}; };
  ds->train = split(file->train());
  ds->validation = split(file->validation());
  ds->test = split(file->test());
  ds->mean = file->mean();
  ds->stddev = file->stddev();
  ds->scale = file->scale();
  ds->shift = file->shift();
  ds->storage = std::move(file);
  return std::shared_ptr<const DatasetSplits>(std::move(ds));
}

uint64_t SplitMix64(uint64_t* state) {
  *state += kGolden;
  uint64_t z = *state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t MemberDataSeed(uint64_t experiment_seed, uint64_t init_seed) {
  uint64_t s = init_seed;
  uint64_t state = experiment_seed ^ SplitMix64(&s);
  return SplitMix64(&state);
}

std::vector<int32_t> EpochPermutation(uint64_t data_seed, uint64_t epoch, int64_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(i);
  uint64_t state = data_seed ^ (kGolden * (epoch + 1));
  for (int64_t i = n - 1; i >= 1; --i) {
    uint64_t j = SplitMix64(&state) % static_cast<uint64_t>(i + 1);
    std::swap(p[i], p[j]);
  }
  return p;
}

void BatchIndices(uint64_t data_seed, uint64_t cursor, int64_t batch, int64_t n,
                  std::vector<int64_t>* out, std::vector<int32_t>* epoch_cache,
                  int64_t* cached_epoch) {
  out->resize(static_cast<size_t>(batch));
  const uint64_t un = static_cast<uint64_t>(n);
  for (int64_t i = 0; i < batch; ++i) {
    const uint64_t pos = cursor + static_cast<uint64_t>(i);
    const int64_t epoch = static_cast<int64_t>(pos / un);
    if (epoch != *cached_epoch || epoch_cache->size() != un) {
      *epoch_cache = EpochPermutation(data_seed, static_cast<uint64_t>(epoch), n);
      *cached_epoch = epoch;
    }
    (*out)[i] = (*epoch_cache)[pos % un];
  }
}

}  // namespace ckpt::model
