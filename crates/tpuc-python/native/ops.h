// The device's one path for ATen ops (the boxed fallback of the PrivateUse1 key): each op,
// keyed by its arguments' dtypes, layouts and non-tensor values, runs a program compiled once
// for that key. The first call of a key asks the planner (Python: it traces and compiles the
// op, module.cpp) for an `Entry`; every later call runs it without entering Python.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime.h"

namespace tpuc {

// Where an input of an op's graph comes from.
struct Input {
  enum Kind { kTensor, kHost, kFloat } kind;
  int index;  // the device tensor, host tensor or float (in argument order)
  c10::ScalarType dtype = c10::ScalarType::Float;  // of a float
};

// Where an output of a graph comes from: a result of its program, or one of its inputs.
struct Output {
  enum Kind { kResult, kInput } kind;
  int index;
};

// A graph's compiled program: it takes the graph's inputs, then `constants`, and a seed when
// `random`; `outputs` are the graph's outputs out of its `results`.
struct Compiled {
  ProgramPtr program;
  std::vector<ValuePtr> constants;
  std::vector<Output> outputs;
  size_t results = 0;
  bool random = false;
};

// Runs `compiled` on `device` with the graph's `inputs`, without waiting: the graph's outputs.
// `what` names it in an error.
std::vector<ValuePtr> launch(const Compiled& compiled, c10::DeviceIndex device,
                             std::vector<ValuePtr> inputs, const char* what);

// A storage the op writes: the device tensor whose storage takes graph output `output` (a
// value of `dims`), after the tensor is resized to `resize` when it has another size.
struct Write {
  int tensor;
  int output;
  std::vector<int64_t> dims;
  c10::ScalarType dtype;
  std::optional<std::vector<int64_t>> resize;
};

// What the op returns, in its schema's order.
struct Return {
  enum Kind { kNew, kArgument, kList, kValue, kView } kind;
  int index = 0;  // the graph output (kNew), device tensor (kArgument, kView)
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> sizes, strides;  // kNew: its sizes; kView: its layout
  int64_t offset = 0;
  std::vector<Return> items;  // kList
  c10::IValue value;          // kValue
  // kNew: the dimension along which a result padded to its largest size is cut to the entry's
  // count (an op whose size depends on values: nonzero, masked_select, boolean indexing,
  // unique), or -1.
  int64_t cut = -1;
};

struct Entry {
  enum Kind { kProgram, kHost, kView } kind = kProgram;
  Compiled compiled;
  std::vector<Input> inputs;  // of its graph
  std::vector<Write> writes;
  std::vector<Return> returns;
  // The planner's number of its graph (fused mode joins graphs by it), unique in the process.
  int64_t graph = -1;
  bool lifted = false;  // its floats are inputs: it serves every value of them
  // The graph output holding the count (int64) its counted results are cut to, or -1: the
  // device computes it and the host reads it back, as any eager accelerator does.
  int count_output = -1;
};

// The planner: an entry for an op on these arguments (the stack's last ones).
// `types` and `values` are the entry's key less the op (the same on every run of the same
// build): the planner keeps plans on disk by them, so that a second process finds them.
using Planner = std::function<std::shared_ptr<Entry>(const c10::OperatorHandle&,
                                                     c10::ArrayRef<c10::IValue>,
                                                     std::string_view types,
                                                     std::string_view values)>;
// Runs an op on the host (for an entry of kind kHost), replacing its arguments on the stack by
// its results.
using HostRunner = std::function<void(const c10::OperatorHandle&, torch::jit::Stack*)>;
void set_planner(Planner planner, HostRunner host);

// Debug mode: runs each op through `runner`, given the op, its stack and a function running
// it (the ops the runner's own checks run are not checked again); an empty runner ends it.
using DebugRunner = std::function<void(const c10::OperatorHandle&, torch::jit::Stack*,
                                       const std::function<void()>&)>;
void set_debug(DebugRunner runner);

// The boxed kernel of every op without a kernel of its own on the device.
void run_op(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// Calls op `name` (`aten::copy_`) on the device's path with `arguments`: its results.
std::vector<c10::IValue> call(const char* name, const char* overload,
                              std::vector<c10::IValue> arguments);

struct CacheStats {
  uint64_t hits = 0, misses = 0, host_runs = 0, entries = 0;
};
CacheStats cache_stats();
void clear_cache();

}  // namespace tpuc
