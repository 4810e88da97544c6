// Status and StatusOr<T>: how every ckpt component reports failure.
//
// A Status is OK or holds a code and a message that names the thing that
// failed ("member 7 v12: tensor conv1.weight checksum mismatch"). Library
// exceptions never cross a component boundary: the file that calls the library
// catches them and returns a Status. CKPT_CHECK is for broken invariants only,
// never for input or I/O.
//
// Thread-safety: values; distinct objects may be used from distinct threads.
#ifndef CKPT_BASE_STATUS_H_
#define CKPT_BASE_STATUS_H_

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ckpt {

enum class StatusCode : int {
  kOk = 0,
  kNotFound = 1,
  kInvalidArgument = 2,
  kCorruption = 3,
  kIOError = 4,
  kUnavailable = 5,
  kAborted = 6,
  kResourceExhausted = 7,
  kInternal = 8,
  kAlreadyExists = 9,
  kFailedPrecondition = 10,
};

// Returns "OK", "NotFound", ... for `code`.
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status NotFound(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
  static Status InvalidArgument(std::string m) {
    return Status(StatusCode::kInvalidArgument, std::move(m));
  }
  static Status Corruption(std::string m) { return Status(StatusCode::kCorruption, std::move(m)); }
  static Status IOError(std::string m) { return Status(StatusCode::kIOError, std::move(m)); }
  static Status Unavailable(std::string m) {
    return Status(StatusCode::kUnavailable, std::move(m));
  }
  static Status Aborted(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
  static Status ResourceExhausted(std::string m) {
    return Status(StatusCode::kResourceExhausted, std::move(m));
  }
  static Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
  static Status AlreadyExists(std::string m) {
    return Status(StatusCode::kAlreadyExists, std::move(m));
  }
  static Status FailedPrecondition(std::string m) {
    return Status(StatusCode::kFailedPrecondition, std::move(m));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  bool IsNotFound() const { return code_ == StatusCode::kNotFound; }
  bool IsInvalidArgument() const { return code_ == StatusCode::kInvalidArgument; }
  bool IsCorruption() const { return code_ == StatusCode::kCorruption; }
  bool IsIOError() const { return code_ == StatusCode::kIOError; }
  bool IsUnavailable() const { return code_ == StatusCode::kUnavailable; }
  bool IsAborted() const { return code_ == StatusCode::kAborted; }
  bool IsResourceExhausted() const { return code_ == StatusCode::kResourceExhausted; }

  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK.
  Status WithPrefix(std::string_view prefix) const;

  // "OK" or "Corruption: <message>".
  std::string ToString() const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

namespace internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, const std::string& msg);
}  // namespace internal

// A value or the Status that explains why there is none.
// REQUIRES: a StatusOr is never built from an OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT: implicit by design
    if (status_.ok()) internal::CheckFailed(__FILE__, __LINE__, "!status.ok()", "OK without value");
  }
  StatusOr(Status&& status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) internal::CheckFailed(__FILE__, __LINE__, "!status.ok()", "OK without value");
  }
  StatusOr(const T& value) : value_(value) {}        // NOLINT
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT
  template <typename U, typename = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                                    !std::is_same_v<std::decay_t<U>, Status> &&
                                                    !std::is_same_v<std::decay_t<U>, StatusOr<T>> &&
                                                    !std::is_same_v<std::decay_t<U>, T>>>
  StatusOr(U&& value) : value_(std::forward<U>(value)) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  const T& value() const& {
    CheckOk();
    return *value_;
  }
  T& value() & {
    CheckOk();
    return *value_;
  }
  T&& value() && {
    CheckOk();
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void CheckOk() const {
    if (!status_.ok()) internal::CheckFailed(__FILE__, __LINE__, "ok()", status_.ToString());
  }
  Status status_;
  std::optional<T> value_;
};

}  // namespace ckpt

#define CKPT_STATUS_CONCAT_INNER_(a, b) a##b
#define CKPT_STATUS_CONCAT_(a, b) CKPT_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define CKPT_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::ckpt::Status ckpt_status_ = (expr);        \
    if (!ckpt_status_.ok()) return ckpt_status_; \
  } while (0)

// `lhs = value of expr` (a StatusOr), or returns its Status from the enclosing function.
#define CKPT_ASSIGN_OR_RETURN(lhs, expr) \
  CKPT_ASSIGN_OR_RETURN_IMPL_(CKPT_STATUS_CONCAT_(ckpt_statusor_, __LINE__), lhs, expr)
#define CKPT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

// Aborts with a message on a broken invariant. Never for input or I/O errors.
#define CKPT_CHECK(cond)                                                       \
  do {                                                                         \
    if (!(cond)) ::ckpt::internal::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define CKPT_CHECK_OK(expr)                                                                    \
  do {                                                                                         \
    ::ckpt::Status ckpt_check_status_ = (expr);                                                \
    if (!ckpt_check_status_.ok())                                                              \
      ::ckpt::internal::CheckFailed(__FILE__, __LINE__, #expr, ckpt_check_status_.ToString()); \
  } while (0)

#endif  // CKPT_BASE_STATUS_H_
