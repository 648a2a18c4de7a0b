// DLTensor descriptions for tests: shapes and strides owned next to the DLTensor view.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <dlpack/dlpack.h>

namespace mhccl::testing {

constexpr DLDataType kBF16{kDLBfloat, 16, 1};
constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kI32{kDLInt, 32, 1};
constexpr DLDataType kU8{kDLUInt, 8, 1};
constexpr DLDataType kI64{kDLInt, 64, 1};

// A DLTensor with its own shape/stride storage (stable address: hold by unique_ptr or value in
// a node-stable container).
struct Desc {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLTensor t{};

  Desc() = default;
  Desc(void* data, DLDataType dtype, std::vector<int64_t> s, int device = 0)
      : shape(std::move(s)) {
    t.data = data;
    t.device = DLDevice{kDLCUDA, device};
    t.ndim = static_cast<int>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
  }
  Desc(const Desc& o) : shape(o.shape), strides(o.strides), t(o.t) { rebind(); }
  Desc& operator=(const Desc& o) {
    shape = o.shape;
    strides = o.strides;
    t = o.t;
    rebind();
    return *this;
  }
  void rebind() {
    t.shape = shape.data();
    t.strides = strides.empty() ? nullptr : strides.data();
  }
  Desc& with_strides(std::vector<int64_t> s) {
    strides = std::move(s);
    rebind();
    return *this;
  }
  const DLTensor* get() const { return &t; }
  DLTensor* get() { return &t; }
};

}  // namespace mhccl::test
