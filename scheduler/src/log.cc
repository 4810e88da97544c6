#include "log.h"

#include <atomic>

namespace ckpt::scheduler {
namespace {

std::atomic<int64_t> root_exceptions{0};

}  // namespace

void CountRootException() { root_exceptions.fetch_add(1, std::memory_order_relaxed); }
int64_t RootExceptionCount() { return root_exceptions.load(std::memory_order_relaxed); }

}  // namespace ckpt::scheduler
