#include "core/dtype.h"

#include "core/error.h"

namespace tandem {

size_t element_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int64: return 8;
    case DType::Int32: return 4;
    case DType::UInt8: return 1;
  }
  TANDEM_FAIL("unknown dtype ", int(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int64: return "int64";
    case DType::Int32: return "int32";
    case DType::UInt8: return "uint8";
  }
  return "unknown";
}

const char* safetensors_name(DType t) {
  switch (t) {
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
    case DType::Float16: return "F16";
    case DType::BFloat16: return "BF16";
    case DType::Int64: return "I64";
    case DType::Int32: return "I32";
    case DType::UInt8: return "U8";
  }
  return "unknown";
}

DType dtype_from_safetensors(const std::string& name) {
  for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int64,
                  DType::Int32, DType::UInt8})
    if (name == safetensors_name(t)) return t;
  TANDEM_FAIL("unknown dtype '", name, "', expected one of F32 F64 F16 BF16 I64 I32 U8");
}

bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}

}  // namespace tandem
