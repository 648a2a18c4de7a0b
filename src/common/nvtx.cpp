// NVTX ranges (src/common/nvtx.h): the one translation unit that includes NVTX3.
#include "common/nvtx.h"

#if MHCCL_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace mhccl::detail::nvtx {

#if MHCCL_NVTX
namespace {
// Null when no tool is attached: NVTX3 then returns no domain, and every later call of it would
// be a no-op anyway.
nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("mhccl");
  return d;
}
}  // namespace

bool attached() { return domain() != nullptr; }

void push(const std::string& name, int64_t payload, Kind kind) {
  nvtxEventAttributes_t a = {};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.colorType = NVTX_COLOR_ARGB;
  a.color = static_cast<uint32_t>(kind);
  a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
  a.payload.llValue = payload;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name.c_str();
  nvtxDomainRangePushEx(domain(), &a);
}

void pop() { nvtxDomainRangePop(domain()); }
#endif

std::string call_name(const char* op, const char* protocol, int64_t m) {
  return std::string("mhccl.") + op + " " + protocol + " M=" + std::to_string(m);
}

}  // namespace mhccl::detail::nvtx
