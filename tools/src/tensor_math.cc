#include "tensor_math.h"

#include <cmath>
#include <cstring>

namespace ckpt::tool {
namespace {

template <typename T>
T Load(const uint8_t* data, size_t i) {
  T v;
  std::memcpy(&v, data + i * sizeof(T), sizeof(T));
  return v;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

float Bf16ToFloat(uint16_t b) {
  uint32_t bits = uint32_t{b} << 16;
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

}  // namespace

double ElementAsDouble(format::DType dtype, const uint8_t* data, size_t i) {
  using format::DType;
  switch (dtype) {
    case DType::kF64:
      return Load<double>(data, i);
    case DType::kF32:
      return Load<float>(data, i);
    case DType::kF16:
      return HalfToFloat(Load<uint16_t>(data, i));
    case DType::kBF16:
      return Bf16ToFloat(Load<uint16_t>(data, i));
    case DType::kI64:
      return static_cast<double>(Load<int64_t>(data, i));
    case DType::kI32:
      return Load<int32_t>(data, i);
    case DType::kI16:
      return Load<int16_t>(data, i);
    case DType::kI8:
      return Load<int8_t>(data, i);
    case DType::kU8:
      return Load<uint8_t>(data, i);
    case DType::kBool:
      return Load<uint8_t>(data, i) != 0 ? 1.0 : 0.0;
  }
  return 0;
}

bool IsFloating(format::DType dtype) {
  using format::DType;
  return dtype == DType::kF64 || dtype == DType::kF32 || dtype == DType::kF16 ||
         dtype == DType::kBF16;
}

int64_t FirstNonFinite(format::DType dtype, const uint8_t* data, size_t numel) {
  if (!IsFloating(dtype)) return -1;
  for (size_t i = 0; i < numel; ++i) {
    if (!std::isfinite(ElementAsDouble(dtype, data, i))) return static_cast<int64_t>(i);
  }
  return -1;
}

double L2Distance(format::DType dtype, const uint8_t* a, const uint8_t* b, size_t numel) {
  double sum = 0;
  for (size_t i = 0; i < numel; ++i) {
    double d = ElementAsDouble(dtype, b, i) - (a != nullptr ? ElementAsDouble(dtype, a, i) : 0.0);
    sum += d * d;
  }
  return std::sqrt(sum);
}

}  // namespace ckpt::tool
