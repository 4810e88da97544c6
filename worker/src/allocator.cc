#include "ckpt/worker/allocator.h"

#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <malloc.h>
#include <sys/types.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace ckpt::worker {
namespace {

// jemalloc's control entry point where jemalloc is the process's malloc:
// linked ahead of libc or preloaded, so that the malloc every caller binds to
// is jemalloc's. A jemalloc merely loaded (dlopen) does not count.
using MallctlFn = int (*)(const char*, void*, size_t*, void*, size_t);

MallctlFn Mallctl() {
  void* ctl = dlsym(RTLD_DEFAULT, "mallctl");
  Dl_info info;
  if (ctl == nullptr || dladdr(ctl, &info) == 0 || info.dli_fname == nullptr) return nullptr;
  void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  const bool replaces = dlsym(lib, "malloc") == dlsym(RTLD_DEFAULT, "malloc");
  dlclose(lib);
  return replaces ? reinterpret_cast<MallctlFn>(ctl) : nullptr;
}

// Purging off: every arena, those made later (the oversize one included:
// jemalloc gives it no purging delay only where the default has one) too.
bool KeepJemallocPages(MallctlFn mallctl) {
  const char* conf = std::getenv("MALLOC_CONF");
  if (conf != nullptr && (std::strstr(conf, "dirty_decay_ms") != nullptr ||
                          std::strstr(conf, "muzzy_decay_ms") != nullptr)) {
    return false;
  }
  bool ok = true;
  // Arena 4096 is every arena (MALLCTL_ARENAS_ALL, jemalloc.h).
  for (const char* name : {"arenas.dirty_decay_ms", "arenas.muzzy_decay_ms",
                           "arena.4096.dirty_decay_ms", "arena.4096.muzzy_decay_ms"}) {
    ssize_t never = -1;
    ok = mallctl(name, nullptr, nullptr, &never, sizeof(never)) == 0 && ok;
  }
  return ok;
}

}  // namespace

bool TuneAllocatorForTraining() {
  if (MallctlFn mallctl = Mallctl()) return KeepJemallocPages(mallctl);
  for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(v) != nullptr) return false;
  }
  const bool mmap_ok =
      mallopt(M_MMAP_THRESHOLD, static_cast<int>(kTrainingMmapThresholdBytes)) == 1;
  const bool trim_ok =
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrainingTrimThresholdBytes)) == 1;
  return mmap_ok && trim_ok;
}

std::string MallocName() {
  if (MallctlFn mallctl = Mallctl()) {
    const char* version = nullptr;
    size_t size = sizeof(version);
    if (mallctl("version", static_cast<void*>(&version), &size, nullptr, 0) == 0 &&
        version != nullptr) {
      return std::string("jemalloc ") + version;
    }
    return "jemalloc";
  }
  return std::string("glibc ") + gnu_get_libc_version();
}

}  // namespace ckpt::worker
