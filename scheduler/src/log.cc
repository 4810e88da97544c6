#include "log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>

namespace ckpt::scheduler {
namespace {

std::atomic<int64_t> root_exceptions{0};

std::shared_ptr<spdlog::logger> MakeLogger() {
  const bool tty = isatty(STDERR_FILENO) == 1;
  std::shared_ptr<spdlog::logger> logger;
  if (tty) {
    logger = std::make_shared<spdlog::logger>(
        "ckpt-scheduler", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    logger->set_pattern("%H:%M:%S.%e %^%l%$ %v");
  } else {
    logger = std::make_shared<spdlog::logger>("ckpt-scheduler",
                                              std::make_shared<spdlog::sinks::stderr_sink_mt>());
    logger->set_pattern("%l: %v");
  }
  spdlog::level::level_enum level = spdlog::level::info;
  if (const char* v = std::getenv("CKPT_TRACE"); v != nullptr && std::string(v) == "1") {
    level = spdlog::level::trace;
  }
  if (const char* v = std::getenv("CKPT_LOG_LEVEL"); v != nullptr && *v != '\0') {
    level = spdlog::level::from_str(v);
  }
  logger->set_level(level);
  // Warnings and errors reach the journal at once; info lines too, since a
  // scheduler's lines are few (progress lines are not logged).
  logger->flush_on(spdlog::level::trace);
  return logger;
}

}  // namespace

spdlog::logger& Logger() {
  static const std::shared_ptr<spdlog::logger> logger = MakeLogger();
  return *logger;
}

}  // namespace ckpt::scheduler

namespace ckpt::scheduler {

void CountRootException() { root_exceptions.fetch_add(1, std::memory_order_relaxed); }
int64_t RootExceptionCount() { return root_exceptions.load(std::memory_order_relaxed); }

}  // namespace ckpt::scheduler
