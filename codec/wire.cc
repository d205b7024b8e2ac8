#include "codec/wire.h"

#include <cstring>
#include <string>

#include "codec/half.h"
#include "codec/ternary.h"

namespace sparsereduce::codec {

const char* WireFormatName(WireFormat format) {
  switch (format) {
    case WireFormat::kRaw: return "raw";
    case WireFormat::kFloat16: return "fp16";
    case WireFormat::kBFloat16: return "bf16";
    case WireFormat::kTernary: return "ternary";
  }
  return "?";
}

uint32_t MaxWireBytes(WireFormat format, uint32_t n, uint32_t element_size) {
  switch (format) {
    case WireFormat::kRaw: return n * element_size;
    case WireFormat::kFloat16:
    case WireFormat::kBFloat16: return 2 * n;
    case WireFormat::kTernary: return static_cast<uint32_t>(MaxTernaryBytes(n));
  }
  return 0;
}

Status CheckWireBytes(WireFormat format, uint32_t n, uint32_t element_size, uint32_t data_bytes) {
  const uint32_t max = MaxWireBytes(format, n, element_size);
  if (format == WireFormat::kTernary ? (data_bytes <= 4 || data_bytes > max) : data_bytes != max) {
    return ProtocolError(std::to_string(data_bytes) + " data bytes for a " + WireFormatName(format) + " block of " +
                         std::to_string(n) + " elements (" +
                         (format == WireFormat::kTernary ? "5.." : "exactly ") + std::to_string(max) + ")");
  }
  return Status::Ok();
}

Status CheckWireBlock(WireFormat format, uint32_t n, uint32_t element_size, std::span<const std::byte> data) {
  if (Status st = CheckWireBytes(format, n, element_size, static_cast<uint32_t>(data.size())); !st.ok()) return st;
  return format == WireFormat::kTernary ? CheckTernary(data, n) : Status::Ok();
}

uint32_t EncodeFloats(WireFormat format, const float* values, uint32_t n, std::byte* out) {
  switch (format) {
    case WireFormat::kRaw:
      std::memcpy(out, values, 4 * size_t{n});
      return 4 * n;
    case WireFormat::kFloat16:
      EncodeHalf(values, n, out);
      return 2 * n;
    case WireFormat::kBFloat16:
      EncodeBFloat16(values, n, out);
      return 2 * n;
    case WireFormat::kTernary: break;
  }
  return 0;
}

Status DecodeFloats(WireFormat format, std::span<const std::byte> in, uint32_t n, float* out, bool accumulate) {
  if (Status st = CheckWireBytes(format, n, 4, static_cast<uint32_t>(in.size())); !st.ok()) return st;
  switch (format) {
    case WireFormat::kRaw:
      if (accumulate) {
        for (uint32_t j = 0; j < n; ++j) {
          float v;
          std::memcpy(&v, in.data() + 4 * j, 4);
          out[j] += v;
        }
      } else {
        std::memcpy(out, in.data(), 4 * size_t{n});
      }
      return Status::Ok();
    case WireFormat::kFloat16: DecodeHalf(in.data(), n, out, accumulate); return Status::Ok();
    case WireFormat::kBFloat16: DecodeBFloat16(in.data(), n, out, accumulate); return Status::Ok();
    case WireFormat::kTernary: return DecodeTernary(in, n, out, accumulate);
  }
  return ProtocolError("unknown wire format");
}

}  // namespace sparsereduce::codec
