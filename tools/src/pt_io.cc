// The one LibTorch translation unit of ckpt-tool (see pt_io.h).
#include "pt_io.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <string_view>

#include "pt_archive.h"

namespace ckpt::tool {
namespace {

at::ScalarType ToScalarType(format::DType d) {
  using format::DType;
  switch (d) {
    case DType::kF64:
      return at::kDouble;
    case DType::kF32:
      return at::kFloat;
    case DType::kF16:
      return at::kHalf;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kI64:
      return at::kLong;
    case DType::kI32:
      return at::kInt;
    case DType::kI16:
      return at::kShort;
    case DType::kI8:
      return at::kChar;
    case DType::kU8:
      return at::kByte;
    case DType::kBool:
      return at::kBool;
  }
  return at::kFloat;
}

StatusOr<c10::IValue> ToIValue(const PyValue& v, int depth) {
  using K = PyValue::Kind;
  if (depth > 64) return Status::InvalidArgument("a value to save nests too deep");
  switch (v.kind) {
    case K::kNone:
      return c10::IValue();
    case K::kBool:
      return c10::IValue(v.b);
    case K::kInt:
      return c10::IValue(v.i);
    case K::kFloat:
      return c10::IValue(v.f);
    case K::kString:
      return c10::IValue(v.s);
    case K::kList: {
      c10::impl::GenericList list(c10::AnyType::get());
      for (const auto& x : v.items) {
        CKPT_ASSIGN_OR_RETURN(c10::IValue y, ToIValue(*x, depth + 1));
        list.push_back(std::move(y));
      }
      return c10::IValue(std::move(list));
    }
    case K::kTuple: {
      std::vector<c10::IValue> items;
      for (const auto& x : v.items) {
        CKPT_ASSIGN_OR_RETURN(c10::IValue y, ToIValue(*x, depth + 1));
        items.push_back(std::move(y));
      }
      return c10::IValue(c10::ivalue::Tuple::create(std::move(items)));
    }
    case K::kDict: {
      bool int_keys = !v.dict.empty() && v.dict.front().first->kind == K::kInt;
      c10::TypePtr key_type = c10::StringType::get();
      if (int_keys) key_type = c10::IntType::get();
      c10::impl::GenericDict dict(key_type, c10::AnyType::get());
      for (const auto& [k, x] : v.dict) {
        if (k->kind != (int_keys ? K::kInt : K::kString)) {
          return Status::InvalidArgument("a dict to save mixes key types");
        }
        CKPT_ASSIGN_OR_RETURN(c10::IValue y, ToIValue(*x, depth + 1));
        dict.insert_or_assign(int_keys ? c10::IValue(k->i) : c10::IValue(k->s), std::move(y));
      }
      return c10::IValue(std::move(dict));
    }
    case K::kTensor: {
      int64_t numel = 1;
      for (int64_t d : v.shape) numel *= d;
      if (static_cast<size_t>(numel) * format::DTypeSize(v.dtype) != v.data.size()) {
        return Status::InvalidArgument("a tensor to save has " + std::to_string(v.data.size()) +
                                       " bytes for shape of " + std::to_string(numel) +
                                       " elements");
      }
      at::Tensor t = at::empty(v.shape, at::TensorOptions().dtype(ToScalarType(v.dtype)));
      if (!v.data.empty()) std::memcpy(t.data_ptr(), v.data.data(), v.data.size());
      return c10::IValue(std::move(t));
    }
    default:
      return Status::InvalidArgument("a value of this kind cannot be saved to .pt");
  }
}

Status WritePt(const std::string& path, const PyValue& value,
               const std::map<std::string, std::string>& extra_records) {
  CKPT_ASSIGN_OR_RETURN(c10::IValue root, ToIValue(value, 0));
  // Tensor ids are assigned in the order the pickler meets them; each one's
  // storage becomes the record data/<id>.
  std::vector<at::Tensor> tensors;
  std::map<const void*, std::string> ids;
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t n) { pickle.insert(pickle.end(), buf, buf + n); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/
      [&](const at::Tensor& t) {
        const void* key = t.storage().unsafeGetStorageImpl();
        auto it = ids.find(key);
        if (it != ids.end()) return it->second;
        std::string id = std::to_string(tensors.size());
        ids.emplace(key, id);
        tensors.push_back(t);
        return id;
      },
      /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(root);
  pickler.stop();
  caffe2::serialize::PyTorchStreamWriter writer(path);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Storage& st = tensors[i].storage();
    writer.writeRecord("data/" + std::to_string(i), st.data(), st.nbytes());
  }
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  static const char kByteOrder[] = "little";
  writer.writeRecord("byteorder", kByteOrder, sizeof(kByteOrder) - 1);
  for (const auto& [name, bytes] : extra_records) {
    writer.writeRecord(name, bytes.data(), bytes.size());
  }
  writer.writeEndOfFile();
  if (!writer.finalized()) return Status::IOError("cannot write " + path);
  return Status::OK();
}

StatusOr<PyRef> ReadPt(const std::string& path, size_t max_bytes) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return Status::NotFound(path + ": no such file");
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return Status::IOError(path + ": " + ec.message());
  if (size > max_bytes) {
    return Status::InvalidArgument(path + " is " + std::to_string(size) + " bytes, above the " +
                                   std::to_string(max_bytes) + " accepted");
  }
  // The reader allocates what a record's entry claims: every record must be
  // stored, so that the file bounds each (pt_archive.h).
  CKPT_RETURN_IF_ERROR(CheckPtRecordsStored(path));
  caffe2::serialize::PyTorchStreamReader reader(path);
  if (!reader.hasRecord("data.pkl")) {
    return Status::Corruption(path + ": no data.pkl (not a torch.save archive)");
  }
  auto [pkl, pkl_size] = reader.getRecord("data.pkl");
  auto value = Unpickle(std::string_view(static_cast<const char*>(pkl.get()), pkl_size));
  if (!value.ok()) return Status(value.status().code(), path + ": " + value.status().message());
  // Each storage record is read once, however many tensors view it.
  std::map<std::string, std::pair<at::DataPtr, size_t>> records;
  auto storage = [&](const std::string& key) -> StatusOr<std::string_view> {
    const std::string record = "data/" + key;
    auto it = records.find(record);
    if (it == records.end()) {
      if (!reader.hasRecord(record)) return Status::NotFound(record);
      auto [ptr, size] = reader.getRecord(record);
      it = records.emplace(record, std::make_pair(std::move(ptr), size)).first;
    }
    return std::string_view(static_cast<const char*>(it->second.first.get()), it->second.second);
  };
  // Bounded by the file: every byte of it viewed twice at most (a tied pair
  // of parameters shares one storage), whatever the views claim.
  CKPT_RETURN_IF_ERROR(FillTensorData(value->get(), storage, path, kPtViewBytesPerFileByte * size));
  return *value;
}

}  // namespace

Status WritePtChecked(const std::string& path, const PyValue& value,
                      const std::map<std::string, std::string>& extra_records) {
  try {
    return WritePt(path, value, extra_records);
  } catch (const std::exception& e) {
    std::string what = e.what();
    return Status::IOError("cannot write " + path + ": " + what.substr(0, what.find('\n')));
  }
}

StatusOr<PyRef> ReadPtChecked(const std::string& path, size_t max_bytes) {
  try {
    return ReadPt(path, max_bytes);
  } catch (const std::exception& e) {
    std::string what = e.what();
    return Status::Corruption(path +
                              " is not a readable .pt archive: " + what.substr(0, what.find('\n')));
  }
}

}  // namespace ckpt::tool

extern "C" void CkptToolWritePt(const std::string* path, const ckpt::tool::PyValue* value,
                                const std::map<std::string, std::string>* extra_records,
                                ckpt::Status* out) {
  *out = ckpt::tool::WritePtChecked(*path, *value, *extra_records);
}

extern "C" void CkptToolReadPt(const std::string* path, size_t max_bytes, ckpt::tool::PyRef* value,
                               ckpt::Status* out) {
  auto v = ckpt::tool::ReadPtChecked(*path, max_bytes);
  if (v.ok()) {
    *value = *v;
    *out = ckpt::Status::OK();
  } else {
    *out = v.status();
  }
}
