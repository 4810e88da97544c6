// .pt files: the zip archive torch.save writes (PyTorch's "zipfile"
// serialization: <archive>/data.pkl, <archive>/data/<key>, <archive>/version).
//
// Writing pickles a PyValue with torch::jit::Pickler(..., tag_aggregates=false)
// into a caffe2::serialize::PyTorchStreamWriter, so that
// torch.load(path, weights_only=True) returns plain dicts, lists and tensors
// (docs/ARCHITECTURE.md "Interop with Python PyTorch"). Reading takes the archive apart
// with PyTorchStreamReader and unpickles data.pkl with the restricted
// unpickler of pickle_reader.h: pickled code is refused, never run.
//
// pt_io.cc is the only translation unit of ckpt-tool that includes LibTorch
// headers. It is built as a module (ckpt-tool-pt.so, in lib/ beside the
// bin/ of ckpt-tool) that these two functions load with dlopen on first
// use, so that LibTorch's load time (half a second) is paid only by the
// commands that read or write .pt. Without the module (a build without
// LibTorch) both return Unavailable.
//
// Thread-safety: free functions.
#ifndef CKPT_TOOLS_SRC_PT_IO_H_
#define CKPT_TOOLS_SRC_PT_IO_H_

#include <map>
#include <string>

#include "ckpt/base/status.h"
#include "pickle_reader.h"

namespace ckpt::tool {

// Writes `value` (None, bools, ints, floats, strings, lists, tuples, dicts with
// string or int keys, tensors with `data`) to `path`, and each of
// `extra_records` as the archive record <archive>/<name> (torch.load ignores
// them; Python's zipfile reads them). InvalidArgument for a
// value of another kind or a tensor whose data does not match its shape;
// IOError naming the path when it cannot be written.
Status WritePtFile(const std::string& path, const PyValue& value,
                   const std::map<std::string, std::string>& extra_records = {});

// Reads `path` (at most `max_bytes`). Returns the saved object with every
// tensor's `data` filled (contiguous, row-major). NotFound / IOError naming the
// path; Corruption naming it for a file that is not a readable archive, a
// compressed record or one larger than the file (pt_archive.h), a missing or
// short storage record, a tensor outside its storage or not contiguous,
// tensors holding more than kPtViewBytesPerFileByte times the file;
// FailedPrecondition for pickled code (pickle_reader.h).
StatusOr<PyRef> ReadPtFile(const std::string& path, size_t max_bytes);

}  // namespace ckpt::tool

// The module's entry points (C linkage, so dlsym finds them by these names).
extern "C" {
void CkptToolWritePt(const std::string* path, const ckpt::tool::PyValue* value,
                     const std::map<std::string, std::string>* extra_records, ckpt::Status* out);
void CkptToolReadPt(const std::string* path, size_t max_bytes, ckpt::tool::PyRef* value,
                    ckpt::Status* out);
}

#endif  // CKPT_TOOLS_SRC_PT_IO_H_
