// Dataset files as Python writes them, built byte by byte for tests of
// ckpt::format::TensorDataset and of what reads it (the tool's export), and
// safetensors files of hand-written headers for the readers' tests.
#ifndef CKPT_TESTS_FORMAT_TENSOR_FILES_H_
#define CKPT_TESTS_FORMAT_TENSOR_FILES_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::testing {

struct Array {
  std::string name;
  std::string dtype;  // safetensors name: U8, F32, I64, F16
  std::vector<int64_t> shape;
  std::string bytes;
};

template <typename T>
Array Make(std::string name, std::string dtype, std::vector<int64_t> shape,
           const std::vector<T>& v) {
  return Array{std::move(name), std::move(dtype), std::move(shape),
               std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T))};
}

// A safetensors file of this header text, as given (no padding, any bytes:
// for headers a writer would not make), and these data bytes.
inline std::string SafetensorsFile(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

// The layout of safetensors' writer: u64 header length, JSON padded with
// spaces to a multiple of 8, the tensors in order.
inline std::string Safetensors(const std::vector<Array>& arrays) {
  nlohmann::json h = nlohmann::json::object();
  size_t offset = 0;
  for (const Array& a : arrays) {
    h[a.name] = {{"dtype", a.dtype},
                 {"shape", a.shape},
                 {"data_offsets", {offset, offset + a.bytes.size()}}};
    offset += a.bytes.size();
  }
  std::string json = h.dump();
  while (json.size() % 8 != 0) json += ' ';
  std::string data;
  for (const Array& a : arrays) data += a.bytes;
  return SafetensorsFile(json, data);
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_FORMAT_TENSOR_FILES_H_
