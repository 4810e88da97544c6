#include "configure_message.h"

#include "ckpt/format/tensor_dataset.h"

namespace ckpt::scheduler {

ipc::Configure ConfigureMessage(const records::ExperimentConfig& c) {
  ipc::Configure m;
  m.experiment = c.name;
  m.model_spec = c.model_spec;
  m.model_sha256 = c.model_sha256;
  m.optimizer = c.optimizer;
  m.dataset = c.dataset;
  if (c.data_format == format::DatasetFormat::kIdx) {
    m.dataset_path = c.dataset_path;
  } else {
    m.tensor_data = c.TensorData();
  }
  m.loss = c.loss;
  m.metric = c.metric;
  m.augment = c.augment;
  m.batch_size = c.batch_size;
  m.eval_size = c.eval_size;
  m.seed = c.seed;
  return m;
}

}  // namespace ckpt::scheduler
