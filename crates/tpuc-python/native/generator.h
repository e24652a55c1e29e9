// The device's random state: one per device, as CUDA's Philox generators have it, a seed and an
// offset. A program's random ops draw from StableHLO's rng_bit_generator keyed by
// [seed, offset] (THREE_FRY's key and counter), and each program moves the offset on by a
// stride past anything one program draws. DTensor's random ops set the offset themselves around
// each op (`get_rng_state`/`set_rng_state`: 16 bytes, the seed then the offset, as CUDA's).
#pragma once

#include <c10/core/Device.h>

#include <array>
#include <cstdint>

namespace tpuc {

struct RandomState {
  uint64_t seed;
  uint64_t offset;
};

RandomState random_state(c10::DeviceIndex device);
void set_random_state(c10::DeviceIndex device, RandomState state);

// The key of a program's random ops on `device`, the offset moved on past it.
std::array<uint64_t, 2> next_random_key(c10::DeviceIndex device);

}  // namespace tpuc
