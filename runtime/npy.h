// NumPy's .npy format (numpy.lib.format, versions 1.0, 2.0 and 3.0), read
// memory-mapped: the trainer's "npy" datasets are one .npy file per model input.
// Only C-order little-endian arrays of the dtypes a model can consume are
// accepted; anything else is an Error that says how to convert the file.
//
// Layout: "\x93NUMPY", major, minor, the header length (u16 little-endian in
// 1.0, u32 in 2.0 and 3.0), then the header, a Python dict literal such as
// "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }" padded with
// spaces and ended by '\n', then the data: exactly prod(shape) * itemsize bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/mapped_file.h"
#include "runtime/tensor_types.h"

namespace napkin::runtime {

// The descrs read_npy accepts, with napkin's name for each:
//   <f4 f32   <f8 f64   <f2 f16   <i4 i32   <i8 i64   <u2 u16   |u1 u8   |b1 bool
struct NpyArray {
  explicit NpyArray(MappedFile f) : file(std::move(f)) {}

  MappedFile file;
  std::string descr;            // as in the header, e.g. "<f4"
  DType dtype = DType::F32;
  size_t itemsize = 0;
  std::vector<int64_t> shape;   // () for a scalar
  int64_t numel = 0;
  const char* data = nullptr;   // the first element, inside `file`

  const std::string& path() const { return file.path(); }
};

// A shape as numpy writes it in a header: (2, 3), (5,), ().
std::string npy_shape_text(const std::vector<int64_t>& shape);

// Maps and validates PATH: magic, version, header syntax, a supported descr,
// C order, and a data section of exactly numel * itemsize bytes.
NpyArray read_npy(const std::string& path);

// Writes a version 1.0 file (2.0 if the header needs more than 64 KiB), the
// header padded so the data starts at a multiple of 64 bytes, as numpy does.
// `bytes` must equal prod(shape) * itemsize(descr).
void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data, size_t bytes);

}  // namespace napkin::runtime
