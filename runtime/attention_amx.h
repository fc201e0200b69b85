// The bf16 fused attention on AMX tiles (runtime/amx.h): the same
// FlashAttention-2 algorithm, contract and determinism as runtime/attention.h,
// for bf16 operands on CPUs with AMX. runtime::Attention picks it when
// amx::available(); the f32-tile path in attention.cpp serves every other
// case. Internal to the runtime.
//
// Numerics: the products Q Kᵀ, P V, dO Vᵀ, Pᵀ dO, dSᵀ Q and dS K read bf16
// operands and accumulate in f32 (tdpbf16ps). Q, K, V and dO are bf16 already;
// P and dS are rounded to bf16 (nearest even) before the products that read
// them, as FlashAttention does on GPUs. The softmax, its running max and sum,
// lse and dS = P (dP - D) are f32. With rotary embeddings (rope: the
// table of desc.rope, else null) q and k are rotated in f32 and rounded to
// bf16 once (as the rope op's bf16 output would be) before they are packed;
// dQ and dK are rotated back in f32 before they are rounded.
#pragma once

#include <cstdint>

#include "runtime/attention_desc.h"
#include "runtime/rope.h"
#include "runtime/thread_pool.h"

namespace napkin::runtime::attention_amx {

void forward(const AttentionDesc& d, const RopeTable* rope, const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* o, float* lse,
             ThreadPool& pool);
void backward(const AttentionDesc& d, const RopeTable* rope, const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* o,
              const float* lse, const uint16_t* d_o, uint16_t* dq, uint16_t* dk, uint16_t* dv, ThreadPool& pool);

}  // namespace napkin::runtime::attention_amx
