// What PyTorch asks of a device besides kernels: its guard (the current device per thread,
// streams, synchronizing) and its hooks (availability, generators, device count).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "fusion.h"
#include "runtime.h"
#include "storage.h"

namespace tpuc {
namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;
thread_local c10::DeviceIndex t_current = 0;

c10::DeviceIndex checked(c10::Device device) {
  TORCH_CHECK(device.type() == kType, "tpuc: not a device of tpuc: ", device);
  auto index = device.has_index() ? device.index() : t_current;
  int count = std::max(device_count(), 1);
  TORCH_CHECK(index >= 0 && index < count, "tpuc: no device ", static_cast<int>(index),
              ": the tpuc device has ", count, " (TPUC_DEVICES chooses how many CPU devices)");
  return index;
}

// Runs what fused mode recorded, then waits for the devices.
void finish() {
  flush();
  synchronize();
}

// One stream per device: the plugin runs a device's programs in the order they are started.
struct Guard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device device) const override {
    auto old = t_current;
    t_current = checked(device);
    return {kType, old};
  }
  c10::Device getDevice() const override { return {kType, t_current}; }
  void setDevice(c10::Device device) const override { t_current = checked(device); }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.has_index()) t_current = device.index();
  }
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(std::max(device_count(), 1));
  }
  // Events: a device's programs run in the order they start and a value is ready when what
  // computes it is, so waiting on an event holds already (the autograd engine records and waits
  // on them between devices); synchronizing one waits for the device.
  void record(void** event, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = new char(0);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<char*>(event);
  }
  void synchronizeEvent(void*) const override { finish(); }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override { finish(); }
  void synchronizeDevice(const c10::DeviceIndex) const override { finish(); }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  // Host code asking for the device's generator (an op run on the host) gets the CPU's; the
  // device's own programs are keyed by its random state (generator.h, docs/random.md).
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Device getDeviceFromPtr(void*) const override { return {kType, t_current}; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(std::max(device_count(), 1));
  }
  void setCurrentDevice(c10::DeviceIndex device) const override { t_current = checked({kType, device}); }
  c10::DeviceIndex getCurrentDevice() const override { return t_current; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = t_current;
    t_current = checked({kType, device});
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage(storage, nbytes);
  }
};

}  // namespace

void register_hooks() {
  static bool done = false;
  if (!done) {
    at::RegisterPrivateUse1HooksInterface(new Hooks());
    done = true;
  }
}

}  // namespace tpuc
