// A Python buffer (NumPy array, torch tensor's .numpy(), memoryview, ...) held for the duration of a
// collective. The Worker reduces in place, so the memory is used as it is: no copy in, no copy out. Holding
// the Py_buffer keeps the exporter alive and, for NumPy, forbids resizing the array while the I/O thread may
// write into it.
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace sparsereduce::python {

enum class ElementType { kFloat32, kInt32 };

class HeldBuffer {
 public:
  // Takes a writable, C-contiguous float32 or int32 buffer of `object`; otherwise raises (as pybind11
  // exceptions) TypeError for a wrong type or dtype and ValueError for a read-only or non-contiguous one, whose
  // message starts "sparsereduce: <who>: " (who: "job J rank R"). Requires the GIL.
  static HeldBuffer Acquire(PyObject* object, const std::string& who);

  HeldBuffer() = default;
  HeldBuffer(HeldBuffer&& other) noexcept;
  HeldBuffer& operator=(HeldBuffer&& other) noexcept;
  HeldBuffer(const HeldBuffer&) = delete;
  HeldBuffer& operator=(const HeldBuffer&) = delete;
  ~HeldBuffer() { Release(); }

  // Gives the buffer back to its exporter. Requires the GIL (as does the destructor when it still holds one).
  void Release();

  ElementType type() const { return type_; }
  size_t count() const { return count_; }
  std::span<float> floats() const { return {static_cast<float*>(view_.buf), count_}; }
  std::span<int32_t> ints() const { return {static_cast<int32_t*>(view_.buf), count_}; }

 private:
  Py_buffer view_{};
  bool held_ = false;
  ElementType type_ = ElementType::kFloat32;
  size_t count_ = 0;
};

}  // namespace sparsereduce::python
