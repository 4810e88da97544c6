// The CONFIGURE message of an experiment (private to ckpt::scheduler): the
// settings its workers need, taken typed from the parsed experiment file
// (records::ExperimentConfig) into the worker protocol's own types
// (ipc::Configure), so that the worker never sees the scheduler's records.
//
// Thread-safety: a pure function.
#ifndef CKPT_SCHEDULER_CONFIGURE_MESSAGE_H_
#define CKPT_SCHEDULER_CONFIGURE_MESSAGE_H_

#include "ckpt/ipc/messages.h"
#include "ckpt/records/config.h"

namespace ckpt::scheduler {

// A tensor file's path and options travel once (Configure::tensor_data), an
// IDX directory as Configure::dataset_path; unset loss and metric stay unset
// (the data's defaults, decided by the worker's trainer as by the parser).
ipc::Configure ConfigureMessage(const records::ExperimentConfig& config);

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_CONFIGURE_MESSAGE_H_
