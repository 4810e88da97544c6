// What a model trained on an IDX directory (the MNIST family) must fit, read
// the way the worker's dataset reader (worker/src/dataset.cc) reads it but
// without LibTorch and without holding the files: a sample's shape from the
// train images' header, and the classes (1 + the largest label of the train
// and t10k label files), so that the experiment file's parser can check a
// layer list before anything is created.
//
// Thread-safety: pure function (reads files).
#ifndef CKPT_RECORDS_SRC_IDX_SHAPE_H_
#define CKPT_RECORDS_SRC_IDX_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::records {

struct IdxShape {
  std::vector<int64_t> sample_shape;  // [1, H, W] or [C, H, W]
  int64_t classes = 0;
};

// Reads `dir`'s train-images-idx3-ubyte header and streams its two label
// files (each plain, or else ".gz", as the worker picks them; each opened
// once as a regular file, so a FIFO or a device is refused without blocking)
// through a fixed buffer: memory does not follow the files, and no more is
// inflated than the headers' counts. Any error (a missing or malformed file,
// more labels than the worker's 1 GiB cap) is returned for the caller to
// leave to the worker, whose reader names it.
StatusOr<IdxShape> ReadIdxShape(const std::string& dir);

}  // namespace ckpt::records

#endif  // CKPT_RECORDS_SRC_IDX_SHAPE_H_
