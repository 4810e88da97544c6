// ModelSpec: the architecture every member of an experiment shares, as a list
// of layers, and the checkpoint layout (tensor names, dtypes, shapes) that
// follows from it and the optimizer.
//
// A spec is written as one of:
//   "lenet5"            built in: conv 1->6 k5 pad2, relu, maxpool 2, conv 6->16 k5,
//                       relu, maxpool 2, flatten, fc 400->120, relu, fc 120->84, relu,
//                       fc 84->10
//   "resnet20"          built in, for [3, 32, 32] inputs: He et al. 2016's CIFAR
//                       ResNet-20 (conv 16, 3x3 basic blocks of 16, 32, 64
//                       channels, conv1x1 shortcuts where the shape changes,
//                       global average pooling, fc 64->10; 0.27 M parameters)
//   a JSON array        [{"type": "conv2d", "out": 6, "kernel": 5, "padding": 2},
//                        {"type": "relu"}, ..., {"type": "linear", "out": 10}]
//   a JSON object       {"input": [1, 28, 28], "layers": [ ...as above... ]}
//   "torchscript:PATH"  a module saved from Python with torch.jit.save; its
//                       layout is known only once loaded (Trainer::Create)
//
// Layer objects ("type" and its fields; every field but "out"/"kernel" has a default):
//   conv2d       in (inferred), out, kernel, stride 1, padding 0, bias true
//   linear       in (inferred), out, bias true
//   maxpool2d    kernel, stride = kernel, padding 0
//   avgpool2d    kernel, stride = kernel, padding 0
//   batchnorm2d  features (inferred), eps 1e-5, momentum 0.1
//   dropout      p 0.5
//   relu, tanh, flatten
//   globalavgpool  mean over height and width: [C, H, W] -> [C] (flattens)
//   residual     layers (a list as above: the body), shortcut "identity" |
//                "conv1x1"; computes body(x) + shortcut(x). "identity" needs
//                the body to keep the shape; "conv1x1" is a 1x1 convolution
//                without bias (stride inferred from the body's output size)
//                then a batchnorm2d, named <block>.shortcut.conv1 / .bn1, or
//                as "shortcut_names": [conv name, batchnorm2d name] say
//                (e.g. a PyTorch block's "layer2.0.downsample.0" / ".1").
//                Layers inside are named <block>.conv1, ... (block: res1, ...)
//   any layer with state may carry "name"; otherwise conv2d layers are named
//   conv1, conv2, ..., linear layers fc1, fc2, ..., batchnorm2d layers bn1, ...
// conv2d, pooling and batchnorm2d act on [N, C, H, W] and come before the
// flatten; linear acts on [N, F] and comes after it. The input shape defaults
// to [1, 28, 28] (the MNIST family); a [F] input (tabular features) starts flat.
// layers() lists every layer in pre-order: a residual, then its body's and
// shortcut's layers (LayerSpec::body, ::shortcut), then the next layer.
//
// State names follow PyTorch's state_dict: "<layer>.weight", "<layer>.bias",
// and for batchnorm2d also "running_mean", "running_var" (F32) and
// "num_batches_tracked" (I64, shape []). Optimizer state is
// "optim.<param>.<slot>": SGD "momentum_buffer"; Adam/AdamW "exp_avg",
// "exp_avg_sq" and "step" (F32, shape [], as torch.optim keeps it).
//
// Thread-safety: values; immutable once parsed.
#ifndef CKPT_MODEL_MODEL_SPEC_H_
#define CKPT_MODEL_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/checkpoint.h"
#include "ckpt/format/optimizer.h"

namespace ckpt::model {

enum class LayerKind {
  kConv2d,
  kLinear,
  kRelu,
  kTanh,
  kMaxPool2d,
  kAvgPool2d,
  kBatchNorm2d,
  kDropout,
  kFlatten,
  kGlobalAvgPool,
  kResidual,
};

// "conv2d", "linear", ...
std::string_view LayerKindName(LayerKind kind);

struct LayerSpec {
  LayerKind kind = LayerKind::kRelu;
  std::string name;       // state_dict prefix; "" for layers without state
  int64_t in = 0;         // conv2d: in channels; linear: in features; batchnorm2d: features
  int64_t out = 0;        // conv2d: out channels; linear: out features
  int64_t kernel = 0;     // conv2d, pooling
  int64_t stride = 1;     // conv2d, pooling
  int64_t padding = 0;    // conv2d, pooling
  bool bias = true;       // conv2d, linear
  double eps = 1e-5;      // batchnorm2d
  double momentum = 0.1;  // batchnorm2d: running-stat update factor
  double p = 0.5;         // dropout probability
  // residual: the `body` layers that follow it in ModelSpec::layers() are its
  // body, the `shortcut` layers after those its shortcut (0 = identity).
  int body = 0;
  int shortcut = 0;
  // Activation shape after this layer, without the batch dimension:
  // [C, H, W] before the flatten, [F] after it.
  std::vector<int64_t> output_shape;
};

// One tensor of a member's state.
struct TensorSpec {
  std::string name;
  format::DType dtype = format::DType::kF32;
  std::vector<int64_t> shape;
  bool trainable = false;  // a parameter the optimizer updates (not a buffer)

  int64_t numel() const;
};

// The optimizers and their checkpoint slots (ckpt/format/optimizer.h).
using format::OptimizerKind;
using format::OptimizerKindName;
using format::OptimizerSlots;
using format::ParseOptimizerKind;

class ModelSpec {
 public:
  // Parses `text` (see the top of this file) for inputs of shape `input_shape`
  // ([C, H, W]) unless the JSON names its own "input". Infers every omitted
  // size and checks that the layers fit together. Returns InvalidArgument
  // naming the layer (index and type) for: unknown type or field of the wrong
  // type, a size that does not match the incoming activation, a layer on the
  // wrong side of the flatten, an empty output, duplicate names, malformed JSON.
  static StatusOr<ModelSpec> Parse(std::string_view text,
                                   std::vector<int64_t> input_shape = {1, 28, 28});

  // The text it was parsed from ("lenet5", JSON, "torchscript:...").
  const std::string& text() const { return text_; }
  bool is_torchscript() const { return !torchscript_path_.empty(); }
  const std::string& torchscript_path() const { return torchscript_path_; }

  // Empty for a TorchScript spec.
  const std::vector<LayerSpec>& layers() const { return layers_; }
  const std::vector<int64_t>& input_shape() const { return input_shape_; }
  // Number of logits the model produces (the last layer's width); 0 for TorchScript.
  int64_t num_outputs() const { return num_outputs_; }
  // True when some layer draws random numbers in training (dropout).
  bool has_dropout() const;

  // Floating-point operations per sample (2 per multiply-add) of the conv2d
  // and linear layers: ForwardFlopsPerSample for evaluation;
  // TrainingFlopsPerSample for a training step, which adds each layer's
  // weight gradient and input gradient (none for the first such layer, whose
  // input is the data). Elementwise work (activations, pooling, batch norm,
  // biases, the optimizer) is left out: a few percent for LeNet-5. What
  // `ckpt-bench train` divides by time to give GFLOP/s. 0 for TorchScript.
  int64_t ForwardFlopsPerSample() const;
  int64_t TrainingFlopsPerSample() const;

  // Model tensors in state_dict order (per layer: weight, bias, then buffers).
  // Empty for a TorchScript spec.
  std::vector<TensorSpec> ModelTensors() const;

 private:
  std::string text_;
  std::string torchscript_path_;
  std::vector<LayerSpec> layers_;
  std::vector<int64_t> input_shape_;
  int64_t num_outputs_ = 0;
};

// The whole state layout of a member: `model` tensors, then for each trainable
// one its optimizer slots, named "optim.<param>.<slot>". Validation of a
// checkpoint demands exactly these names, dtypes and shapes (order free).
std::vector<TensorSpec> StateLayout(const std::vector<TensorSpec>& model, OptimizerKind optimizer);

}  // namespace ckpt::model

#endif  // CKPT_MODEL_MODEL_SPEC_H_
