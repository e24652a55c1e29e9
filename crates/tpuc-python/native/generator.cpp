#include "generator.h"

#include <c10/core/GeneratorImpl.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_map>

namespace tpuc {
namespace {

// The counter space one program may draw from: 2^32 64-bit blocks, far beyond any program.
constexpr uint64_t kStride = uint64_t{1} << 32;

std::mutex g_mutex;
// By device; a device not seeded yet starts from torch's default seed, as CUDA's do.
std::unordered_map<c10::DeviceIndex, RandomState> g_states;

RandomState& state_of(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0, "tpuc: no random state for device ", static_cast<int>(device));
  return g_states.try_emplace(device, RandomState{c10::default_rng_seed_val, 0}).first->second;
}

}  // namespace

RandomState random_state(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_of(device);
}

void set_random_state(c10::DeviceIndex device, RandomState state) {
  std::lock_guard<std::mutex> lock(g_mutex);
  state_of(device) = state;
}

std::array<uint64_t, 2> next_random_key(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& state = state_of(device);
  std::array<uint64_t, 2> key{state.seed, state.offset};
  state.offset += kStride;
  return key;
}

}  // namespace tpuc
