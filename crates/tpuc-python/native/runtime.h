// The Rust runtime as the native device sees it: the table of C functions the extension `_tpuc`
// hands over once (`tpuc._tpuc.native_api`, layout of `NativeApi` in src/native.rs), the target
// the device's values live on, and owned handles to values and programs.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace tpuc {

// Opaque handles of the runtime: a value on a device, a program loaded on it, the target.
struct Value;
struct Program;
struct Target;

// Mirrors `NativeApi` (src/native.rs); each function returns null or an error message.
struct Api {
  uint32_t abi_version;
  char* (*upload)(const Target*, size_t device, uint32_t dtype, const int64_t* dims, size_t rank,
                  const uint8_t* data, size_t nbytes, Value** out);
  char* (*download)(const Value*, uint8_t* dst, size_t nbytes);
  char* (*run)(const Program*, size_t device, const Value* const* inputs, size_t n_inputs,
               const Value* seed, Value** outputs, size_t n_outputs);
  char* (*synchronize)(const Target*);
  Value* (*clone_value)(const Value*);
  void (*release_value)(Value*);
  const Program* (*clone_program)(const Program*);
  void (*release_program)(const Program*);
  const Target* (*clone_target)(const Target*);
  void (*release_target)(const Target*);
  void (*free_error)(char*);
};
constexpr uint32_t kAbiVersion = 2;

using ValuePtr = std::shared_ptr<Value>;
using ProgramPtr = std::shared_ptr<const Program>;

// Set once by `init` (module.cpp).
void set_runtime(const Api* api, const Target* target, int devices,
                 std::vector<int> element_codes);
bool ready();
void shutdown();
const Api& api();
int device_count();
// The runtime's code of a dtype; an error naming it when tpuc does not handle it.
uint32_t element_code(c10::ScalarType dtype);

// Throws the runtime's error (if any) as a c10::Error, `what` first.
void check(char* error, const char* what);

ValuePtr own(Value* value);  // takes the handle
ValuePtr share(const Value* value);  // a new reference
ProgramPtr share(const Program* program);

// Copies from the host to the device: how many, and their bytes.
struct UploadStats {
  uint64_t uploads = 0, bytes = 0;
};
UploadStats upload_stats();

// A new value of `dims` on `device` from `nbytes` bytes of dense, row-major host memory.
ValuePtr upload(c10::DeviceIndex device, c10::ScalarType dtype, const std::vector<int64_t>& dims,
                const void* data, size_t nbytes);
void download(const Value& value, void* dst, size_t nbytes);
void synchronize();

}  // namespace tpuc
