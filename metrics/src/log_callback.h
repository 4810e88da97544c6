// The callback the metrics library writes its few log lines through:
// MetricsOptions::log, or the process's logger when that is empty (Metrics
// chooses, at Open).
#ifndef CKPT_METRICS_SRC_LOG_CALLBACK_H_
#define CKPT_METRICS_SRC_LOG_CALLBACK_H_

#include <functional>
#include <string>

#include "ckpt/metrics/metrics.h"

namespace ckpt::metrics {

using LogFn = std::function<void(LogLevel, const std::string&)>;

}  // namespace ckpt::metrics

#endif  // CKPT_METRICS_SRC_LOG_CALLBACK_H_
