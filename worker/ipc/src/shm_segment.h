// A named POSIX shared-memory segment mapped into this process: the one file
// of ckpt::ipc that calls Boost.Interprocess. Its exceptions become Status here.
//
// Thread-safety: the object is immutable after construction; the mapped bytes
// are shared and their protocol is the caller's (see layout.h).
#ifndef CKPT_IPC_SRC_SHM_SEGMENT_H_
#define CKPT_IPC_SRC_SHM_SEGMENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/base/status.h"

namespace ckpt::ipc::internal {

class SharedSegment {
 public:
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  // Creates segment `name` of `bytes` bytes (mode 0600, zero-filled), mapped
  // read-write. AlreadyExists when a segment of that name exists; IOError (with
  // the system's reason) otherwise. With `populate`, the pages are faulted in
  // now rather than on first touch.
  static StatusOr<std::unique_ptr<SharedSegment>> Create(const std::string& name, uint64_t bytes,
                                                         bool populate);
  // Maps an existing segment whole. NotFound when absent, IOError otherwise.
  static StatusOr<std::unique_ptr<SharedSegment>> Open(const std::string& name, bool writable);
  // Unlinks `name`; mappings stay valid until unmapped. OK when absent.
  static Status Remove(const std::string& name);

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  struct Impl;
  explicit SharedSegment(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// OK when `name` can name a segment: 1-200 characters of [A-Za-z0-9._-], not
// starting with '.'. InvalidArgument otherwise.
Status ValidateSegmentName(const std::string& name);

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_SHM_SEGMENT_H_
