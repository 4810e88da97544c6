#include "ckpt/logging/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace ckpt::logging {
namespace {

std::shared_ptr<spdlog::logger> MakeLogger() {
  const bool tty = isatty(STDERR_FILENO) == 1;
  std::shared_ptr<spdlog::logger> logger;
  if (tty) {
    logger = std::make_shared<spdlog::logger>(
        "ckpt", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    logger->set_pattern("%H:%M:%S.%e %^%l%$ %v");
  } else {
    logger =
        std::make_shared<spdlog::logger>("ckpt", std::make_shared<spdlog::sinks::stderr_sink_mt>());
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
  logger->flush_on(spdlog::level::trace);
  return logger;
}

}  // namespace

spdlog::logger& Logger() {
  static const std::shared_ptr<spdlog::logger> logger = MakeLogger();
  return *logger;
}

}  // namespace ckpt::logging
