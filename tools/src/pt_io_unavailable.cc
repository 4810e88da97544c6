// pt_io.h when ckpt is built without LibTorch (CKPT_BUILD_WORKER=OFF).
#include "pt_io.h"

namespace ckpt::tool {

Status WritePtFile(const std::string& path, const PyValue& value,
                   const std::map<std::string, std::string>& extra_records) {
  return Status::Unavailable("cannot write " + path +
                             ": this ckpt-tool was built without LibTorch (.pt support); "
                             "export .safetensors instead");
}

StatusOr<PyRef> ReadPtFile(const std::string& path, size_t max_bytes) {
  return Status::Unavailable("cannot read " + path +
                             ": this ckpt-tool was built without LibTorch (.pt support); "
                             "import .safetensors instead");
}

}  // namespace ckpt::tool
