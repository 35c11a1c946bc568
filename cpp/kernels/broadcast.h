// Framework-free helpers for elementwise kernels: shape broadcasting, a status
// type, and an iteration space that walks a contiguous output while each input
// follows its own element strides (0 on broadcast dimensions).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace opbridge::kernels {

// Success is an empty message. Adapters turn a failure into TORCH_CHECK or an
// ORT error status; the message already names the op and the arguments.
struct Status {
  std::string message;
  bool ok() const { return message.empty(); }
};

inline std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + "]";
}

// Product of the dimensions; false if one is negative or the product overflows int64.
inline bool checked_numel(const std::vector<int64_t>& shape, int64_t& numel) {
  numel = 1;
  for (int64_t size : shape) {
    if (size < 0 || __builtin_mul_overflow(numel, size, &numel)) return false;
  }
  return true;
}

// NumPy / ONNX multidirectional broadcasting, as torch.broadcast_shapes.
inline Status broadcast_shapes(const char* op, const char* a_name, const std::vector<int64_t>& a, const char* b_name,
                               const std::vector<int64_t>& b, std::vector<int64_t>& out) {
  const size_t rank = std::max(a.size(), b.size());
  out.assign(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    // Align from the right, as broadcasting does.
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) {
      return {std::string(op) + ": " + a_name + " of shape " + shape_to_string(a) + " and " + b_name + " of shape " +
              shape_to_string(b) + " cannot be broadcast together (dimension " +
              std::to_string(-static_cast<int64_t>(i) - 1) + " is " + std::to_string(da) + " and " +
              std::to_string(db) + "; sizes must be equal or one of them 1)"};
    }
    out[rank - 1 - i] = da == 1 ? db : da;
  }
  int64_t numel = 0;
  if (!checked_numel(out, numel)) {
    return {std::string(op) + ": the broadcast shape " + shape_to_string(out) + " has too many elements"};
  }
  return {};
}

// Element strides of a tensor of `shape` with element strides `strides`, seen as broadcast to `out_shape`
// (0 on broadcast dimensions, as torch's expand gives).
inline std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                                              const std::vector<int64_t>& out_shape) {
  std::vector<int64_t> result(out_shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    const size_t in_dim = shape.size() - 1 - i;
    result[out_shape.size() - 1 - i] = shape[in_dim] == 1 ? 0 : strides[in_dim];
  }
  return result;
}

// The same for a contiguous tensor.
inline std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& shape,
                                              const std::vector<int64_t>& out_shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return broadcast_strides(shape, strides, out_shape);
}

// Iteration space of a binary elementwise op with a contiguous output. Dimensions
// of size 1 are dropped and neighbours that are contiguous for every operand are
// merged, so the common cases (same shape, scalar, bias over the last dim) end up
// as one long inner row the compiler vectorizes.
struct BinaryLoop {
  std::vector<int64_t> sizes;
  std::vector<int64_t> a_strides;
  std::vector<int64_t> b_strides;
  int64_t numel = 0;
};

inline BinaryLoop make_binary_loop(const std::vector<int64_t>& out_shape, const std::vector<int64_t>& a_strides,
                                   const std::vector<int64_t>& b_strides) {
  BinaryLoop loop;
  loop.numel = 1;
  for (size_t d = 0; d < out_shape.size(); ++d) {
    loop.numel *= out_shape[d];
    if (out_shape[d] == 1) continue;
    const bool mergeable = !loop.sizes.empty() && loop.a_strides.back() == a_strides[d] * out_shape[d] &&
                           loop.b_strides.back() == b_strides[d] * out_shape[d];
    if (mergeable) {
      loop.sizes.back() *= out_shape[d];
      loop.a_strides.back() = a_strides[d];
      loop.b_strides.back() = b_strides[d];
    } else {
      loop.sizes.push_back(out_shape[d]);
      loop.a_strides.push_back(a_strides[d]);
      loop.b_strides.push_back(b_strides[d]);
    }
  }
  if (loop.sizes.empty()) {  // a single element (0-d or all ones)
    loop.sizes = {1};
    loop.a_strides = {0};
    loop.b_strides = {0};
  }
  return loop;
}

// Calls row(a_offset, b_offset, out_offset, length) for the row segments that
// cover output elements [begin, end); within a segment, inputs advance by the
// innermost strides loop.a_strides.back() / loop.b_strides.back().
template <class RowFn>
void for_each_row(const BinaryLoop& loop, int64_t begin, int64_t end, RowFn&& row) {
  const int64_t outer_rank = static_cast<int64_t>(loop.sizes.size()) - 1;
  const int64_t inner = loop.sizes.back();
  std::vector<int64_t> index(static_cast<size_t>(outer_rank), 0);
  int64_t column = begin % inner;
  int64_t rest = begin / inner;
  int64_t a_offset = column * loop.a_strides.back();
  int64_t b_offset = column * loop.b_strides.back();
  for (int64_t d = outer_rank - 1; d >= 0; --d) {
    index[d] = rest % loop.sizes[d];
    rest /= loop.sizes[d];
    a_offset += index[d] * loop.a_strides[d];
    b_offset += index[d] * loop.b_strides[d];
  }
  for (int64_t position = begin; position < end;) {
    const int64_t length = std::min(inner - column, end - position);
    row(a_offset, b_offset, position, length);
    position += length;
    // Back to the start of the row, then odometer-step the outer index.
    a_offset -= column * loop.a_strides.back();
    b_offset -= column * loop.b_strides.back();
    column = 0;
    for (int64_t d = outer_rank - 1; d >= 0; --d) {
      a_offset += loop.a_strides[d];
      b_offset += loop.b_strides[d];
      if (++index[d] < loop.sizes[d]) break;
      a_offset -= loop.a_strides[d] * loop.sizes[d];
      b_offset -= loop.b_strides[d] * loop.sizes[d];
      index[d] = 0;
    }
  }
}

// Splits [0, numel) into tasks of about `chunk` elements and runs them through
// the adapter's parallel_for(num_tasks, task), which must call task(i) once for
// every i in [0, num_tasks), on any threads. Small inputs run inline.
template <class ParallelFor, class ChunkFn>
void parallel_chunks(int64_t numel, int64_t chunk, ParallelFor&& parallel_for, ChunkFn&& body) {
  if (numel <= 0) return;
  const int64_t tasks = (numel + chunk - 1) / chunk;
  auto task = [&](int64_t t) { body(t * chunk, std::min(numel, (t + 1) * chunk)); };
  if (tasks == 1) {
    task(0);
  } else {
    parallel_for(tasks, task);
  }
}

}  // namespace opbridge::kernels
