// A minimal NVTX tool for the CPU tests: loaded by NVTX3 from NVTX_INJECTION64_PATH (as a
// profiler's injection library is), it records every range pushed and popped in any domain, so
// that test_nvtx.cpp can check what a profiler would show. Read back with
// nvtx_recorder_events() (dlsym on this library).
#include <mutex>
#include <string>
#include <vector>

#define NVTX_NO_IMPL  // a tool: the types, not NVTX's implementation
#include <nvtx3/nvToolsExt.h>

namespace {

struct Domain {
  std::string name;
};

std::mutex g_mutex;
std::vector<std::string> g_events;
std::string g_joined;

void record(std::string event) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.push_back(std::move(event));
}

nvtxDomainHandle_t domain_create(const char* name) {
  return reinterpret_cast<nvtxDomainHandle_t>(new Domain{name});  // lives as long as the process
}

std::string domain_name(nvtxDomainHandle_t d) { return d ? reinterpret_cast<const Domain*>(d)->name : "(default)"; }

int range_push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  std::string e = "push " + domain_name(d) + ": ";
  e += a->messageType == NVTX_MESSAGE_TYPE_ASCII ? a->message.ascii : "(not ASCII)";
  if (a->payloadType == NVTX_PAYLOAD_TYPE_INT64) e += " payload " + std::to_string(a->payload.llValue);
  record(e);
  return 0;
}

int range_pop(nvtxDomainHandle_t d) {
  record("pop " + domain_name(d));
  return 0;
}

}  // namespace

extern "C" {

// Every event so far, one a line.
const char* nvtx_recorder_events() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_joined.clear();
  for (const std::string& e : g_events) g_joined += e + "\n";
  return g_joined.c_str();
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (callbacks == nullptr || !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) ||
      size < NVTX_CBID_CORE2_DomainCreateA) {
    return 0;
  }
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&domain_create);
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&range_push);
  *table[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&range_pop);
  return 1;
}

}  // extern "C"
