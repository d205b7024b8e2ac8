#include "held_buffer.h"

#include <pybind11/pybind11.h>

#include <bit>
#include <string>
#include <utility>

namespace sparsereduce::python {

namespace py = pybind11;

namespace {

// Struct-module format of the element ('f', '<f', '=i', ...) -> element type. Byte-order prefixes other than
// native or little-endian (on a little-endian host) would need a byte swap, which an in-place reduction
// cannot do.
bool ParseFormat(const char* format, Py_ssize_t itemsize, ElementType* type) {
  std::string f = format ? format : "B";
  if (!f.empty() &&
      (f[0] == '@' || f[0] == '=' || (f[0] == '<' && std::endian::native == std::endian::little))) {
    f.erase(0, 1);
  }
  if (itemsize != 4 || f.size() != 1) return false;
  if (f[0] == 'f') {
    *type = ElementType::kFloat32;
    return true;
  }
  if (f[0] == 'i' || f[0] == 'l') {  // 'l' is 4 bytes on some platforms; itemsize decides
    *type = ElementType::kInt32;
    return true;
  }
  return false;
}

}  // namespace

HeldBuffer HeldBuffer::Acquire(PyObject* object, const std::string& who) {
  const std::string prefix = "sparsereduce: " + who + ": ";
  HeldBuffer held;
  if (!PyObject_CheckBuffer(object)) {
    throw py::type_error(prefix + "expected a NumPy array or a CPU torch tensor, got " +
                         Py_TYPE(object)->tp_name);
  }
  // Strides and format, read-only allowed: the checks below give clearer messages than the exporter's.
  if (PyObject_GetBuffer(object, &held.view_, PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
  held.held_ = true;
  if (!ParseFormat(held.view_.format, held.view_.itemsize, &held.type_)) {
    throw py::type_error(prefix + "unsupported element type (buffer format '" +
                         (held.view_.format ? held.view_.format : "B") + "', " +
                         std::to_string(held.view_.itemsize) +
                         " bytes); only float32 and int32 are supported");
  }
  if (held.view_.readonly) {
    throw py::value_error(prefix + "the array is read-only; allreduce writes the sum into it in place");
  }
  if (!PyBuffer_IsContiguous(&held.view_, 'C')) {
    throw py::value_error(
        prefix + "the array is not C-contiguous; allreduce works in place without copies, so pass a "
        "contiguous array (e.g. numpy.ascontiguousarray or tensor.contiguous()) and copy the result back");
  }
  held.count_ = static_cast<size_t>(held.view_.len / held.view_.itemsize);
  return held;
}

HeldBuffer::HeldBuffer(HeldBuffer&& other) noexcept
    : view_(other.view_),
      held_(std::exchange(other.held_, false)),
      type_(other.type_),
      count_(other.count_) {}

HeldBuffer& HeldBuffer::operator=(HeldBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    view_ = other.view_;
    held_ = std::exchange(other.held_, false);
    type_ = other.type_;
    count_ = other.count_;
  }
  return *this;
}

void HeldBuffer::Release() {
  if (held_) {
    held_ = false;
    PyBuffer_Release(&view_);
  }
}

}  // namespace sparsereduce::python
