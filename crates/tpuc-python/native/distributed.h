// The device's torch.distributed backend (distributed.cpp).
#pragma once

#include <torch/extension.h>

namespace tpuc {

// Defines `DeviceBackend` and `device_backend(host, timeout)` in `m`; called once torch.distributed
// is imported (c10d's Python classes exist only then).
void register_distributed(pybind11::module_& m);

}  // namespace tpuc
