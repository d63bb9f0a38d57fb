// Element types. f32 is the math type; f64 exists on CPU for gradient checks;
// f16/bf16 hold mixed-precision and compressed-communication data; integer
// types hold labels, indices and raw pixels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem {

enum class DType : uint8_t { Float32, Float64, Float16, BFloat16, Int64, Int32, UInt8 };

constexpr DType kFloat32 = DType::Float32;
constexpr DType kFloat64 = DType::Float64;
constexpr DType kFloat16 = DType::Float16;
constexpr DType kBFloat16 = DType::BFloat16;
constexpr DType kInt64 = DType::Int64;
constexpr DType kInt32 = DType::Int32;
constexpr DType kUInt8 = DType::UInt8;

size_t element_size(DType t);
const char* dtype_name(DType t);        // "float32", ...
const char* safetensors_name(DType t);  // "F32", ...
DType dtype_from_safetensors(const std::string& name);  // throws on unknown
bool is_floating(DType t);

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::Float32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::Float64; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::UInt8; };
template <typename T> constexpr DType dtype_of = DTypeOf<T>::value;

}  // namespace tandem
