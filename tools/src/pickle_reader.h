// PyValue and a restricted unpickler for the data.pkl of a torch.save archive.
//
// torch.save writes a zip archive whose data.pkl is a pickle (protocol 2 by
// default) of the saved object, with each tensor's storage as a persistent id
// ('storage', torch.<T>Storage, key, location, numel) whose bytes are the
// archive record data/<key>, and each tensor rebuilt by
// torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...).
//
// The unpickler reads data only: None, bools, ints, floats, strings, bytes,
// lists, tuples, dicts (and collections.OrderedDict, read as a dict; the
// _metadata a state_dict carries is dropped), storages and tensors. Any other
// global (a class, a function: pickled code) is refused before anything is
// built; nothing is ever called or imported. Input is untrusted: every length
// and index is bounds-checked, nesting is bounded.
//
// Thread-safety: pure functions over values.
#ifndef CKPT_TOOLS_SRC_PICKLE_READER_H_
#define CKPT_TOOLS_SRC_PICKLE_READER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/checkpoint.h"

namespace ckpt::tool {

struct PyValue;
using PyRef = std::shared_ptr<PyValue>;

struct PyValue {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kBytes,
    kList,
    kTuple,
    kDict,
    kTensor,
    kStorage,
    kGlobal
  };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  // kString, kBytes: the value; kGlobal: "module.name"; kStorage: its key.
  std::string s;
  std::vector<PyRef> items;                   // kList, kTuple
  std::vector<std::pair<PyRef, PyRef>> dict;  // kDict, in insertion order

  // kStorage and kTensor.
  format::DType dtype = format::DType::kF32;
  // kTensor: its storage's key, offset (elements), size and stride.
  std::string storage_key;
  int64_t storage_offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  // kTensor: the bytes, row-major contiguous, once the archive's record is read
  // (or, when writing, the bytes to write).
  std::string data;
  // Levels of containers inside this value (0 for a scalar or an empty
  // container); kept by Unpickle, which bounds it by kMaxPickleNesting.
  int depth = 0;

  // Lookup in a kDict with string keys; nullptr when absent or not a dict.
  const PyValue* Get(std::string_view key) const;
};

PyRef MakeNone();
PyRef MakeBool(bool v);
PyRef MakeInt(int64_t v);
PyRef MakeFloat(double v);
PyRef MakeString(std::string v);
PyRef MakeList();
PyRef MakeTuple();
PyRef MakeDict();
PyRef MakeTensor(format::DType dtype, std::vector<int64_t> shape, std::string data);
void DictSet(PyValue* dict, PyRef key, PyRef value);

// The storage dtype torch names `torch.<name>` ("FloatStorage" -> F32);
// InvalidArgument for another name.
StatusOr<format::DType> StorageDType(std::string_view name);

// Bounds of Unpickle (docs/LIMITS.md): values nested deeper, more items on
// the stack or in one dict, or more values copied out of the memo are a
// Corruption naming the limit.
inline constexpr int kMaxPickleNesting = 64;
inline constexpr size_t kMaxPickleStack = 8192;
inline constexpr size_t kMaxPickleDictItems = size_t{1} << 20;
// A .pt file's tensors hold at most this many bytes per byte of the file
// (docs/LIMITS.md): each tensor copies its view of a storage, and a tied pair
// of parameters views one storage twice; more views are refused.
inline constexpr uint64_t kPtViewBytesPerFileByte = 2;

// Reads a pickle. Returns the object; its tensors have storage_key, offset,
// shape and stride filled but no data. The result is a tree (no value
// contains itself: DUP and memo reads copy containers). FailedPrecondition
// naming the global for pickled code; Corruption naming the offset for
// malformed input, an opcode outside the data subset or a bound above.
StatusOr<PyRef> Unpickle(std::string_view pickle);

// The bytes of the storage named `key`, or NotFound when there is none. The
// view must stay valid until FillTensorData returns.
using StorageBytes = std::function<StatusOr<std::string_view>(const std::string& key)>;

// Fills the `data` of every tensor inside `root` (an Unpickle result) from its
// storage: the tensor must be contiguous row-major (a dimension of size 1 may
// have any stride) and lie inside its storage. Corruption naming `origin` for
// a missing storage ("storage record data/<key> is missing"), a tensor that
// is not contiguous or reaches past its storage, a size that overflows, or
// nesting deeper than kMaxPickleNesting, or tensors whose bytes together pass
// `max_tensor_bytes` (checked before each copy: several tensors may view one
// storage, and each holds its own copy); `storage`'s other errors as they are.
Status FillTensorData(PyValue* root, const StorageBytes& storage, const std::string& origin,
                      uint64_t max_tensor_bytes);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_PICKLE_READER_H_
