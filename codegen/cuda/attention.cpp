// Fused attention as CUDA C (ir/loop.h's AttentionParams): FlashAttention-2's
// algorithm. The kernels are templates in the prelude
// (codegen/cuda/attention_device.cpp); this file emits, per plan kernel, a
// config struct NAME_cfg (shapes, element strides, causal, scale, which
// operands load as 16-byte vectors: all compile-time constants) and the
// __global__ wrappers that instantiate them with the operands' offsets.
//
// Launches (B batch, Hq query heads, Hk kv heads, T queries, S keys, D head_dim):
//  forward   NAME     grid B*Hq*ceil(T/64): (o, lse) of a 64-query tile;
//                     query tiles in reverse, so causal blocks (the
//                     heaviest) start first.
//  backward  NAME     grid ceil(8*B*Hq*T/128), 128 threads: delta_i = do_i . o_i
//                     per query row (8 threads a row) into `scratch` (f32;
//                     f64 for f64).
//            NAME_2   grid B*Hk*ceil(S/64): dk, dv of a 64-key tile, walking
//                     the query tiles of every query head of the group (head
//                     order, then tile order) and recomputing P from q, k, lse.
//            NAME_3   grid B*Hq*ceil(T/64): dq of a 64-query tile, walking the
//                     key tiles in order and recomputing P.
//  Causal: a tile is clipped by loop bounds to the tiles that reach the
//  diagonal (key tiles past the last query's diagonal, query tiles before the
//  first key's, are never loaded); only tiles crossing the diagonal or the
//  end of the keys are masked.
//
// Tensor cores (bf16, f16): 128 threads = 4 warps, each owning 16 rows (queries
// in NAME and NAME_3, keys in NAME_2) of the 64-row tile, with
// mma.sync.m16n8k16 (prelude: napkin_mma_m16n8k16_*; f32 accumulators):
//  - A fragments of the warp's own rows (q; k and v; q and do) are loaded once
//    from shared memory into registers; the other side's tiles pass through
//    shared memory, row-major [64][DP + 8] (DP = D rounded up to 16, columns
//    past D zero; the +8 staggers rows across banks and keeps 16-byte rows).
//    B fragments come from them by ldmatrix.x4 (two 8-column blocks per
//    instruction); where the product runs over the tile's rows (P V,
//    dS^T Q, dS K, P^T dO) by ldmatrix.x4.trans, so no tile is stored
//    transposed (a transposed store of 16-bit elements is 8 scalar stores
//    per 16-byte load, which on an H100 cost more than the products).
//  - Fragment layouts (PTX ISA, m16n8k16 .bf16/.f16, g = lane / 4,
//    c = lane % 4): A register j holds A[g + 8 (j & 1)][2c + 8 (j >> 1) + {0,1}],
//    B register j holds B[2c + 8j + {0,1}][g], accumulator e is
//    C[g + 8 (e >> 1)][2c + (e & 1)]. So the accumulators of two adjacent
//    8-column tiles of S are, rounded and packed in pairs, the A fragment of
//    the next product over those 16 columns: P (and dS) never go through
//    shared memory.
//  - The forward fetches the next K and V tiles into registers (16-byte
//    loads where aligned) while it computes on the current ones
//    (napkin_attn_stage); the backward, whose registers are spent on its
//    accumulators, starts the next tiles' loads with cp.async into a second
//    pair of shared buffers (16-byte aligned rows; others load at once).
//    Registers (ptxas, sm_90, D = 64): forward 164, dK/dV 168, dQ 162, no
//    spills.
//  - Softmax: a row's scores sit in the 4 lanes of a quad; row max and sum
//    are quad butterflies (__shfl_xor 1, 2), so the 4 lanes hold the same
//    bits. Scores are scaled by scale * log2 e and exponentiated with exp2f;
//    P and dS are rounded to the 16-bit type for their products, as
//    FlashAttention does; the row sums use the f32 values.
//  - Shared memory per block (shared_fwd/_kv/_q below): forward 3*64 (DP + 8)
//    2 bytes, dK/dV 4*64 (DP + 8) 2 + 512 bytes, dQ 4*64 (DP + 8) 2 bytes;
//    for D = 64: 27 KiB, 36.5 KiB and 36 KiB.
// Rotary embeddings (AttentionParams::rope): the kernels rotate the q and k
// tiles in shared memory (SIMT: the thread's own q or k row in registers)
// right after they are loaded, each load anew (a block of 64 rows rotates each
// key tile it loads: 6 FLOPs and a sincos per pair), with the frequencies
// emitted as a __device__ table NAME_rope_inv; the backward's dq and dk
// accumulators go through shared memory as f32 to be rotated back (SIMT: in
// registers) before they are stored.
// SIMT (f32, f64): 64 threads, one query row (NAME, NAME_3) or key row
// (NAME_2) each, held in registers with its accumulators; the other side's
// rows in shared memory tiles of TILE rows (64, halved until two tiles fit in
// 48 KiB); plain multiply-add loops.
//
// Determinism: no atomics. Every sum has one order fixed by the source and
// the launch shape: dk and dv are summed by one thread (tensor cores: one
// accumulator of one lane) over the group's heads, then query tiles, then
// rows in order; dq over key tiles in order; mma sums are the hardware's,
// which is deterministic; the quad butterflies combine the same two values.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "codegen/cuda/emit.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda::detail {

namespace {

using ir::DType;

constexpr int kRows = 64;  // query (or key) rows per block

bool tensor_cores(DType t) { return t == DType::BF16 || t == DType::F16; }

const char* traits(DType t) {
  switch (t) {
    case DType::BF16: return "napkin_attn_bf16";
    case DType::F16: return "napkin_attn_f16";
    case DType::F32: return "napkin_attn_f32";
    case DType::F64: return "napkin_attn_f64";
    default: break;
  }
  NAPKIN_INTERNAL_CHECK(false, "attention in {}", ir::dtype_name(t));
  return nullptr;
}

struct Dims {
  int64_t B, HQ, HK, T, S, D;
};

// The SIMT tile: 64 rows, halved until two tiles of D elements fit in 48 KiB.
int simt_tile(const Dims& d, DType t) {
  int tile = kRows;
  while (tile > 8 && 2 * tile * d.D * ir::dtype_size(t) > 48 * 1024) tile /= 2;
  return tile;
}

int64_t padded(int64_t d) { return (d + 15) / 16 * 16; }

// Dynamic shared memory of each launch (attention_device.cpp's layouts):
// tensor cores, 64-row tiles [64][DP + 8] of 16-bit elements: forward q, k,
// v; dK/dV two (q, do) pairs (the tile computed on and the next) and the
// tile's lse and delta (f32); dQ two (k, v) pairs.
int shared_fwd(const Dims& d, DType t) {
  if (!tensor_cores(t)) return 2 * simt_tile(d, t) * static_cast<int>(d.D) * ir::dtype_size(t);
  return static_cast<int>(3 * kRows * (padded(d.D) + 8) * 2);
}
int shared_kv(const Dims& d, DType t) {
  const int tile = simt_tile(d, t);
  if (!tensor_cores(t)) return (2 * tile * static_cast<int>(d.D) + 2 * tile) * ir::dtype_size(t);
  return static_cast<int>(4 * kRows * (padded(d.D) + 8) * 2 + 2 * kRows * 4);
}
int shared_q(const Dims& d, DType t) {
  if (!tensor_cores(t)) return shared_fwd(d, t);
  return static_cast<int>(4 * kRows * (padded(d.D) + 8) * 2);
}

// Rows of o load as 16-byte vectors: 16-bit elements, D a multiple of 8, and
// the offset and the batch, head and row strides in bytes multiples of 16.
bool vector_rows(const Operand& o, int64_t D) {
  if (!tensor_cores(o.dtype) || D % 8 != 0) return false;
  return aligned16(o, {o.strides[0], o.strides[1], o.strides[2]});
}

std::string ptr(const Operand& o, bool vec, bool is_const) {
  return fmt::format("({}{}*)(arena + {})", is_const ? "const " : "", storage_type(o.dtype), offset_marker(o, vec));
}

}  // namespace

EmittedKernel emit_attention(const Kernel& k) {
  const ir::AttentionParams& a = k.attention();
  const bool bwd = a.backward;
  NAPKIN_INTERNAL_CHECK(k.inputs.size() == (bwd ? 6u : 3u) && (bwd || k.extra_outputs.size() == 1u),
                        "attention kernel {} with {} inputs and {} extra outputs", k.name, k.inputs.size(),
                        k.extra_outputs.size());
  const std::vector<Operand> grads = bwd ? attention_gradients(k) : std::vector<Operand>{};  // dq, dk, dv
  const Operand &q = k.inputs[0], &kk = k.inputs[1], &v = k.inputs[2];
  const DType t = q.dtype;
  const Dims d{q.sizes[0], q.sizes[1], kk.sizes[1], q.sizes[2], kk.sizes[2], q.sizes[3]};
  NAPKIN_INTERNAL_CHECK(d.HQ % d.HK == 0 && (!a.causal || d.T <= d.S) && d.T > 0 && d.S > 0 && d.D > 0,
                        "attention kernel {}: shapes", k.name);
  const bool tc = tensor_cores(t);
  const int tile = simt_tile(d, t);

  // The operands by role, as the config names them.
  std::vector<std::pair<std::string, const Operand*>> ops = {{"Q", &q}, {"K", &kk}, {"V", &v}};
  if (bwd) {
    ops.insert(ops.end(), {{"O", &k.inputs[3]},
                           {"L", &k.inputs[4]},
                           {"DO", &k.inputs[5]},
                           {"DQ", &grads[0]},
                           {"DK", &grads[1]},
                           {"DV", &grads[2]}});
  }
  const Operand o = bwd ? Operand{} : attention_output(k);  // [B, HQ, T, D] strides, seq-major or not
  if (!bwd) ops.insert(ops.end(), {{"O", &o}, {"L", &k.extra_outputs[0]}});
  auto vec = [&](const Operand& o) { return o.sizes.size() == 4 && vector_rows(o, d.D); };

  Src s;
  if (a.rope) emit_rope_frequencies(s, k.name + "_rope_inv", *a.rope, d.D);
  s.open("struct {}_cfg {{", k.name);
  s.line("static constexpr int B = {}, HQ = {}, HK = {}, T = {}, S = {}, D = {}, TILE = {};", d.B, d.HQ, d.HK, d.T,
         d.S, d.D, tile);
  s.line("static constexpr bool CAUSAL = {};", a.causal ? "true" : "false");
  s.line("static constexpr double SCALE = {:a}, SCALE_LOG2 = {:a};", a.scale, a.scale * (1.0 / std::log(2.0)));
  s.line("static constexpr bool ROPE = {}, ROPE_HALF = {};", a.rope ? "true" : "false",
         a.rope && a.rope->style == ir::RopeStyle::Half ? "true" : "false");
  if (a.rope) s.line("static NAPKIN_DEVICE float rope_inv(int j) {{ return {}_rope_inv[j]; }}", k.name);
  for (const auto& [name, o] : ops) {
    NAPKIN_INTERNAL_CHECK(o->strides.size() == o->sizes.size() && (o->sizes.size() == 3 || o->strides[3] == 1),
                          "attention kernel {}: operand {} strides", k.name, name);
    s.line("static constexpr long long {0}_B = {1}, {0}_H = {2}, {0}_T = {3};", name, o->strides[0], o->strides[1],
           o->strides[2]);
    s.line("static constexpr bool {}_VEC = {};", name, vec(*o) ? "true" : "false");
  }
  s.close("};");

  EmittedKernel e;
  const int block = tc ? 128 : kRows;
  const std::string cfg = k.name + "_cfg", X = traits(t), st = storage_type(t);
  const std::string family = tc ? "mma" : "simt";
  const std::string smem = fmt::format("({}*)napkin_attn_smem", tc ? "unsigned short" : st);
  auto P = [&](const Operand& o, bool is_const) { return ptr(o, vec(o), is_const); };
  const int64_t q_tiles = (d.T + kRows - 1) / kRows, k_tiles = (d.S + kRows - 1) / kRows;
  if (!bwd) {
    begin_kernel(s, k.name, block);
    s.line("NAPKIN_DYNAMIC_SHARED(uint4, napkin_attn_smem);");
    s.line("napkin_attn_fwd_{}<{}, {}>({}, {}, {}, {}, {}, {});", family, cfg, X, P(q, true), P(kk, true),
           P(v, true), P(o, false), P(k.extra_outputs[0], false), smem);
    s.close();
    e.launches.push_back({k.name, d.B * d.HQ * q_tiles, block, shared_fwd(d, t), {}});
  } else {
    const Operand &o = k.inputs[3], &lse = k.inputs[4], &dout = k.inputs[5];
    const std::string acc = t == DType::F64 ? "double" : "float";
    const std::string delta = fmt::format("({}*)scratch", acc);
    const int64_t rows = d.B * d.HQ * d.T;
    begin_kernel(s, k.name, 128);
    s.line("napkin_attn_delta<{}, {}>({}, {}, {});", cfg, X, P(o, true), P(dout, true), delta);
    s.close();
    begin_kernel(s, k.name + "_2", block);
    s.line("NAPKIN_DYNAMIC_SHARED(uint4, napkin_attn_smem);");
    s.line("napkin_attn_bwd_kv_{}<{}, {}>({}, {}, {}, {}, {}, {}, {}, {}, {});", family, cfg, X, P(q, true),
           P(kk, true), P(v, true), P(dout, true), P(lse, true), delta, P(grads[1], false), P(grads[2], false), smem);
    s.close();
    begin_kernel(s, k.name + "_3", block);
    s.line("NAPKIN_DYNAMIC_SHARED(uint4, napkin_attn_smem);");
    s.line("napkin_attn_bwd_q_{}<{}, {}>({}, {}, {}, {}, {}, {}, {}, {});", family, cfg, X, P(q, true), P(kk, true),
           P(v, true), P(dout, true), P(lse, true), delta, P(grads[0], false), smem);
    s.close();
    e.launches.push_back({k.name, grid_for(rows * 8, 128, int64_t{1} << 31), 128, 0, {}});
    e.launches.push_back({k.name + "_2", d.B * d.HK * k_tiles, block, shared_kv(d, t), {}});
    e.launches.push_back({k.name + "_3", d.B * d.HQ * q_tiles, block, shared_q(d, t), {}});
    e.scratch_bytes = rows * (t == DType::F64 ? 8 : 4);
  }
  // sm_90 gives a block at most 227 KiB (opted in above 48 KiB, as the
  // runtime does): the tensor-core kernels reach it at head_dim ~ 400.
  for (const CudaLaunch& l : e.launches)
    NAPKIN_INTERNAL_CHECK(l.shared_bytes <= 232448, "attention kernel {}: head_dim {} needs {} bytes of shared memory",
                          k.name, d.D, l.shared_bytes);
  e.text = s.take();
  return e;
}

}  // namespace napkin::codegen::cuda::detail
