#include "codec/codec_spec.h"

#include <charconv>
#include <cmath>
#include <system_error>

namespace sparsereduce {

const char* CodecName(Codec codec) {
  switch (codec) {
    case Codec::kNone: return "none";
    case Codec::kFloat16: return "fp16";
    case Codec::kBFloat16: return "bf16";
    case Codec::kThreeLC: return "3lc";
    case Codec::kDiana: return "diana";
    case Codec::kTopK: return "topk";
    case Codec::kAdaptive: return "adaptive";
  }
  return "?";
}

Result<Codec> ParseCodec(const std::string& name) {
  for (Codec c : {Codec::kNone, Codec::kFloat16, Codec::kBFloat16, Codec::kThreeLC, Codec::kDiana, Codec::kTopK,
                  Codec::kAdaptive}) {
    if (name == CodecName(c)) return c;
  }
  return InvalidArgument("unknown codec '" + name + "' (none, fp16, bf16, 3lc, diana, topk, adaptive)");
}

namespace {

// The shortest text that reads back as the same float: two specs that differ print differently.
std::string Shortest(float value) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(value);
}

}  // namespace

std::string CodecSpec::ToString() const {
  std::string s = CodecName(codec);
  if (codec == Codec::kNone) return key == 0 ? s : s + "(key=" + std::to_string(key) + ")";
  s += "(key=" + std::to_string(key);
  if (codec == Codec::kThreeLC) {
    s += " s=" + Shortest(sparsity) + (result_fp32 ? " fp32-results" : "") + (tensor_scale ? " tensor-scale" : "");
  }
  if (codec == Codec::kTopK) s += " fraction=" + Shortest(fraction);
  if (codec == Codec::kDiana) s += " alpha=" + Shortest(alpha) + (diana_l2 ? " l2" : " linf");
  return s + ")";
}

CodecSpec WithoutUnusedFields(const CodecSpec& c) {
  CodecSpec out;
  out.codec = c.codec;
  // Kept without a codec too: ranks that pass different keys issued their collectives in different orders, and
  // their tensors would be summed with each other (SPEC_MISMATCH instead).
  out.key = c.key;
  switch (c.codec) {
    case Codec::kThreeLC:
      out.sparsity = c.sparsity;
      out.result_fp32 = c.result_fp32;
      out.tensor_scale = c.tensor_scale;
      break;
    case Codec::kTopK: out.fraction = c.fraction; break;
    case Codec::kDiana:
      out.alpha = c.alpha;
      out.diana_l2 = c.diana_l2;
      break;
    case Codec::kNone:
    case Codec::kFloat16:
    case Codec::kBFloat16:
    case Codec::kAdaptive: break;  // adaptive picks its own k: `fraction` is not used
  }
  return out;
}

Status ValidateCodec(const CodecSpec& c) {
  if (static_cast<uint32_t>(c.codec) > static_cast<uint32_t>(Codec::kAdaptive)) {
    return Status(StatusCode::kUnsupported, "unknown codec value " + std::to_string(static_cast<uint32_t>(c.codec)));
  }
  if (!(c.sparsity >= 1.0f && c.sparsity < 2.0f)) {
    return InvalidArgument("3LC sparsity multiplier " + Shortest(c.sparsity) + " is outside [1, 2)");
  }
  if (!(c.fraction > 0.0f && c.fraction <= 1.0f)) {
    return InvalidArgument("top-k fraction " + Shortest(c.fraction) + " is outside (0, 1]");
  }
  if (!(c.alpha >= 0.0f && c.alpha <= 1.0f)) {
    return InvalidArgument("DIANA alpha " + Shortest(c.alpha) + " is outside [0, 1]");
  }
  if ((c.result_fp32 || c.tensor_scale) && c.codec != Codec::kThreeLC) {
    return InvalidArgument("fp32 results and a tensor-wide scale are 3LC options");
  }
  return Status::Ok();
}

codec::WireFormat UploadFormat(const CodecSpec& c) {
  switch (c.codec) {
    case Codec::kFloat16: return codec::WireFormat::kFloat16;
    case Codec::kBFloat16: return codec::WireFormat::kBFloat16;
    case Codec::kThreeLC:
    case Codec::kDiana: return codec::WireFormat::kTernary;
    default: return codec::WireFormat::kRaw;
  }
}

codec::WireFormat DownloadFormat(const CodecSpec& c) {
  switch (c.codec) {
    case Codec::kFloat16: return codec::WireFormat::kFloat16;
    case Codec::kBFloat16: return codec::WireFormat::kBFloat16;
    case Codec::kThreeLC: return c.result_fp32 ? codec::WireFormat::kRaw : codec::WireFormat::kTernary;
    default: return codec::WireFormat::kRaw;
  }
}

}  // namespace sparsereduce
