// WritePtFile and ReadPtFile (pt_io.h): load the LibTorch module on first use.
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <mutex>
#include <string>

#include "pt_io.h"

namespace ckpt::tool {
namespace {

using WriteFn = void (*)(const std::string*, const PyValue*,
                         const std::map<std::string, std::string>*, Status*);
using ReadFn = void (*)(const std::string*, size_t, PyRef*, Status*);

struct Module {
  WriteFn write = nullptr;
  ReadFn read = nullptr;
  Status status;
};

std::string ExecutableDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// $CKPT_TOOL_PT_MODULE, else lib/ckpt-tool-pt.so beside the executable's bin/.
const Module& LoadModule() {
  static Module module;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("CKPT_TOOL_PT_MODULE");
    const std::string path = env != nullptr && *env != '\0'
                                 ? std::string(env)
                                 : ExecutableDir() + "/../lib/ckpt-tool-pt.so";
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      module.status = Status::Unavailable(".pt support is not available: cannot load " + path +
                                          " (" + (why != nullptr ? why : "unknown error") +
                                          "; a build without LibTorch has none): use .safetensors");
      return;
    }
    module.write = reinterpret_cast<WriteFn>(dlsym(handle, "CkptToolWritePt"));
    module.read = reinterpret_cast<ReadFn>(dlsym(handle, "CkptToolReadPt"));
    if (module.write == nullptr || module.read == nullptr) {
      module.status = Status::Unavailable(path + " is not ckpt-tool's .pt module");
    }
  });
  return module;
}

}  // namespace

Status WritePtFile(const std::string& path, const PyValue& value,
                   const std::map<std::string, std::string>& extra_records) {
  const Module& m = LoadModule();
  if (!m.status.ok()) return m.status;
  Status out;
  m.write(&path, &value, &extra_records, &out);
  return out;
}

StatusOr<PyRef> ReadPtFile(const std::string& path, size_t max_bytes) {
  const Module& m = LoadModule();
  if (!m.status.ok()) return m.status;
  PyRef value;
  Status out;
  m.read(&path, max_bytes, &value, &out);
  if (!out.ok()) return out;
  return value;
}

}  // namespace ckpt::tool
