#include "runtime.h"

#include <atomic>

#include <c10/util/Exception.h>

#include <string>

namespace tpuc {
namespace {
const Api* g_api = nullptr;
const Target* g_target = nullptr;
int g_devices = 0;
// By ScalarType: the runtime's element code, -1 where tpuc has none.
std::vector<int> g_codes;
}  // namespace

void set_runtime(const Api* api, const Target* target, int devices, std::vector<int> codes) {
  TORCH_CHECK(api->abi_version == kAbiVersion, "tpuc: the runtime's native interface is version ",
              api->abi_version, ", the device layer's ", kAbiVersion,
              " (rebuild tpuc: bash tools/setup.sh)");
  if (g_target != nullptr) g_api->release_target(g_target);
  g_api = api;
  g_target = api->clone_target(target);
  g_devices = devices;
  g_codes = std::move(codes);
}

bool ready() { return g_api != nullptr; }

void shutdown() {
  g_api = nullptr;
  g_target = nullptr;
}

const Api& api() {
  TORCH_CHECK(g_api != nullptr, "the tpuc device is not initialised (import tpuc first)");
  return *g_api;
}

int device_count() { return g_devices; }

uint32_t element_code(c10::ScalarType dtype) {
  auto index = static_cast<size_t>(dtype);
  TORCH_CHECK(index < g_codes.size() && g_codes[index] >= 0,
              "tpuc does not handle tensors of dtype ", dtype, " on the tpuc device");
  return static_cast<uint32_t>(g_codes[index]);
}

void check(char* error, const char* what) {
  if (error == nullptr) return;
  std::string message(error);
  api().free_error(error);
  TORCH_CHECK(false, what, ": ", message);
}

ValuePtr own(Value* value) {
  return ValuePtr(value, [](Value* v) {
    if (g_api != nullptr) g_api->release_value(v);
  });
}

ValuePtr share(const Value* value) { return own(api().clone_value(value)); }

ProgramPtr share(const Program* program) {
  return ProgramPtr(api().clone_program(program), [](const Program* p) {
    if (g_api != nullptr) g_api->release_program(p);
  });
}

namespace {
std::atomic<uint64_t> g_uploads{0}, g_uploaded_bytes{0};
}  // namespace

ValuePtr upload(c10::DeviceIndex device, c10::ScalarType dtype, const std::vector<int64_t>& dims,
                const void* data, size_t nbytes) {
  ++g_uploads;
  g_uploaded_bytes += nbytes;
  Value* out = nullptr;
  check(api().upload(g_target, static_cast<size_t>(device), element_code(dtype), dims.data(),
                     dims.size(), static_cast<const uint8_t*>(data), nbytes, &out),
        "copying a tensor to the tpuc device");
  return own(out);
}

UploadStats upload_stats() { return {g_uploads.load(), g_uploaded_bytes.load()}; }

void download(const Value& value, void* dst, size_t nbytes) {
  check(api().download(&value, static_cast<uint8_t*>(dst), nbytes),
        "copying a tensor of the tpuc device to the host");
}

void synchronize() {
  if (g_target != nullptr) check(api().synchronize(g_target), "the tpuc device");
}

}  // namespace tpuc
