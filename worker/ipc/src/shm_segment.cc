#include "shm_segment.h"

#include <sys/mman.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <exception>

namespace bip = boost::interprocess;

namespace ckpt::ipc::internal {

struct SharedSegment::Impl {
  bip::mapped_region region;
};

SharedSegment::SharedSegment(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  data_ = static_cast<uint8_t*>(impl_->region.get_address());
  size_ = impl_->region.get_size();
}

SharedSegment::~SharedSegment() = default;

namespace {

std::string Describe(const bip::interprocess_exception& e) {
  std::string what = e.what();
  int native = e.get_native_error();
  if (native != 0 && what.find(std::strerror(native)) == std::string::npos) {
    what += " (";
    what += std::strerror(native);
    what += ")";
  }
  return what;
}

}  // namespace

Status ValidateSegmentName(const std::string& name) {
  if (name.empty() || name.size() > 200 || name[0] == '.') {
    return Status::InvalidArgument("shared-memory name '" + name +
                                   "': want 1-200 characters, not starting with '.'");
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Status::InvalidArgument("shared-memory name '" + name +
                                     "': only letters, digits, '.', '_' and '-' are allowed");
    }
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Create(const std::string& name,
                                                               uint64_t bytes, bool populate) {
  CKPT_RETURN_IF_ERROR(ValidateSegmentName(name));
  bool created = false;
  try {
    bip::permissions perm;
    perm.set_permissions(0600);
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, perm);
    created = true;
    shm.truncate(static_cast<bip::offset_t>(bytes));
    auto impl = std::make_unique<Impl>();
    impl->region = bip::mapped_region(shm, bip::read_write, 0, bytes, nullptr,
                                      populate ? MAP_POPULATE : bip::default_map_options);
    return std::unique_ptr<SharedSegment>(new SharedSegment(std::move(impl)));
  } catch (const bip::interprocess_exception& e) {
    if (!created && e.get_error_code() == bip::already_exists_error) {
      return Status::AlreadyExists("shared-memory segment '" + name + "' exists");
    }
    if (created) bip::shared_memory_object::remove(name.c_str());
    return Status::IOError("shared-memory segment '" + name + "': create " + std::to_string(bytes) +
                           " bytes: " + Describe(e));
  } catch (const std::exception& e) {
    if (created) bip::shared_memory_object::remove(name.c_str());
    return Status::IOError("shared-memory segment '" + name + "': create: " + e.what());
  }
}

StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Open(const std::string& name,
                                                             bool writable) {
  CKPT_RETURN_IF_ERROR(ValidateSegmentName(name));
  try {
    bip::mode_t mode = writable ? bip::read_write : bip::read_only;
    bip::shared_memory_object shm(bip::open_only, name.c_str(), mode);
    bip::offset_t size = 0;
    if (!shm.get_size(size) || size <= 0) {
      return Status::Corruption("shared-memory segment '" + name + "' is empty");
    }
    auto impl = std::make_unique<Impl>();
    impl->region = bip::mapped_region(shm, mode, 0, static_cast<size_t>(size));
    return std::unique_ptr<SharedSegment>(new SharedSegment(std::move(impl)));
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() == bip::not_found_error) {
      return Status::NotFound("shared-memory segment '" + name + "' does not exist");
    }
    return Status::IOError("shared-memory segment '" + name + "': open: " + Describe(e));
  } catch (const std::exception& e) {
    return Status::IOError("shared-memory segment '" + name + "': open: " + e.what());
  }
}

Status SharedSegment::Remove(const std::string& name) {
  CKPT_RETURN_IF_ERROR(ValidateSegmentName(name));
  errno = 0;
  if (bip::shared_memory_object::remove(name.c_str()) || errno == ENOENT) return Status::OK();
  return Status::IOError("shared-memory segment '" + name + "': remove: " + std::strerror(errno));
}

}  // namespace ckpt::ipc::internal
