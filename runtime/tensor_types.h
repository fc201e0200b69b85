// The runtime's enums for a tensor: its element type, named as the IR names
// them (ir/dtype.h), and the integer types data files carry (u8 u16: .npy;
// u16 u32: token files); its role in a program; a kernel's phase; a GEMM epilogue's
// activation. Compared as enums; the names are for the JSON and messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace napkin::runtime {

enum class DType : uint8_t { F64, F32, F16, BF16, F8E4M3, F8E5M2, I32, I64, Bool, U8, U16, U32 };
std::string_view dtype_name(DType t);
DType parse_dtype(std::string_view name);  // throws Error("unknown dtype NAME")
int64_t element_bytes(DType t);
bool is_integer(DType t);  // i32 i64 u8 u16 u32

// What a named tensor of a program is to the trainer. Output: an inference
// program's result (logits); Metric: a number a training step reports beside
// its loss (runtime/program.h step_metrics).
enum class TensorRole : uint8_t { Param, State, Input, Rng, Loss, Output, Metric };
std::string_view tensor_role_name(TensorRole r);  // "param", "state", "input", "rng", "loss", "output", "metric"
TensorRole parse_tensor_role(std::string_view name);  // throws Error

// The phase of the step a kernel belongs to, named as ir::phase_name names it.
enum class KernelPhase : uint8_t { Forward, Backward, Optimizer, Decode, Setup };
std::string_view phase_name(KernelPhase p);  // "forward", ...
KernelPhase parse_phase(std::string_view name);  // throws Error

enum class GemmActivation : uint8_t { None, Gelu, GeluGrad };
std::string_view activation_name(GemmActivation a);  // "none", "gelu", "gelu_grad"
GemmActivation parse_activation(std::string_view name);  // throws Error

// NAME's index in NAMES (an enum's names in its order); throws Error("unknown WHAT NAME").
size_t name_index(std::span<const std::string_view> names, std::string_view name, const char* what);

}  // namespace napkin::runtime
