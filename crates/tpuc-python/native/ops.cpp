#include "ops.h"

#include <ATen/Functions.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "fusion.h"
#include "generator.h"
#include "storage.h"

namespace tpuc {
namespace {

// What an op's program depends on, and the arguments it runs on.
struct Key {
  std::string types;  // the op and every argument but the floats' values
  std::string values;  // the floats' values
  std::vector<at::Tensor> device, host;  // tensors of the device, and others, in order
  std::vector<double> floats;
};

template <typename T>
void put(std::string& text, T value) {
  text.append(reinterpret_cast<const char*>(&value), sizeof value);
}

void put_ints(std::string& text, c10::IntArrayRef values) {
  put(text, static_cast<int64_t>(values.size()));
  text.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t));
}

void encode(Key& key, const c10::IValue& value);

void encode_tensor(Key& key, const at::Tensor& tensor) {
  if (!tensor.defined()) {
    key.types += 'n';
    return;
  }
  if (tensor.device().type() == c10::DeviceType::PrivateUse1) {
    key.types += 'T';
    put(key.types, tensor.scalar_type());
    put_ints(key.types, tensor.sizes());
    put_ints(key.types, tensor.strides());
    put(key.types, tensor.storage_offset());
    const Slot& slot = slot_of(tensor);
    if (written(slot)) {
      put(key.types, slot.dtype);
      put_ints(key.types, slot.dims);
    } else {
      key.types += 'u';
      put(key.types, slot.nbytes);
    }
    put(key.types, tensor.device().index());
    // Which earlier argument's storage it shares, if any: the program takes one input per
    // storage, so `x.add_(x)` and `x.add_(y)` are two programs.
    int32_t shares = -1;
    const auto* storage = tensor.storage().unsafeGetStorageImpl();
    for (size_t i = 0; i < key.device.size(); ++i) {
      if (key.device[i].storage().unsafeGetStorageImpl() == storage) {
        shares = static_cast<int32_t>(i);
        break;
      }
    }
    put(key.types, shares);
    key.device.push_back(tensor);
  } else if (tensor.unsafeGetTensorImpl()->is_wrapped_number()) {
    // A number the dispatcher wrapped (`mul_(tensor, 0.5)` reaching `mul.out`): Python sees it
    // as the number (torch::jit::toPyObject), so it is keyed as one.
    encode(key, c10::IValue(tensor.item()));
  } else {
    key.types += 'H';
    put(key.types, tensor.scalar_type());
    put(key.types, tensor.device().type());
    put_ints(key.types, tensor.sizes());
    key.host.push_back(tensor);
  }
}

void encode(Key& key, const c10::IValue& value) {
  if (value.isTensor()) {
    encode_tensor(key, value.toTensor());
  } else if (value.isNone()) {
    key.types += 'N';
  } else if (value.isDouble()) {
    key.types += 'f';
    double number = value.toDouble();
    put(key.values, number);
    key.floats.push_back(number);
  } else if (value.isBool()) {
    key.types += value.toBool() ? 'B' : 'b';
  } else if (value.isInt()) {
    key.types += 'i';
    put(key.types, value.toInt());
  } else if (value.isComplexDouble()) {
    key.types += 'c';
    auto number = value.toComplexDouble();
    put(key.types, number.real());
    put(key.types, number.imag());
  } else if (value.isString()) {
    key.types += 's';
    const auto& text = value.toStringRef();
    put(key.types, text.size());
    key.types += text;
  } else if (value.isDevice()) {
    key.types += 'D';
    put(key.types, value.toDevice().type());
    put(key.types, value.toDevice().index());
  } else if (value.isIntList()) {
    key.types += 'I';
    put_ints(key.types, value.toIntVector());
  } else if (value.isList()) {
    key.types += 'L';
    auto list = value.toListRef();
    put(key.types, list.size());
    for (const auto& item : list) encode(key, item);
  } else if (value.isGenerator()) {
    key.types += 'G';  // a generator's op runs on the host (the planner says)
  } else {
    TORCH_CHECK(false, "tpuc: an argument of kind ", value.tagKind(),
                " is not supported on the tpuc device");
  }
}

std::mutex g_mutex;  // guards the tables below (ops may come from autograd's device thread)
std::unordered_map<std::string, std::shared_ptr<Entry>> g_by_values, g_by_types;
Planner g_planner;
HostRunner g_host;
std::atomic<uint64_t> g_hits{0}, g_misses{0}, g_host_runs{0};

std::shared_ptr<Entry> find(const Key& key) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (key.floats.empty()) {
    auto found = g_by_values.find(key.types);
    return found == g_by_values.end() ? nullptr : found->second;
  }
  auto lifted = g_by_types.find(key.types);
  if (lifted != g_by_types.end()) return lifted->second;
  auto found = g_by_values.find(key.types + key.values);
  return found == g_by_values.end() ? nullptr : found->second;
}

void insert(const Key& key, std::shared_ptr<Entry> entry) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (entry->lifted) {
    g_by_types[key.types] = std::move(entry);
  } else {
    g_by_values[key.types + key.values] = std::move(entry);
  }
}

// The key of a program's random ops: the device's random state, moved on past it (generator.h),
// so that torch.manual_seed makes the device's random ops repeatable (docs/random.md).
ValuePtr draw_seed(c10::DeviceIndex device) {
  auto key = next_random_key(device);
  return upload(device, c10::ScalarType::UInt64, {2}, key.data(), sizeof key);
}

ValuePtr host_value(c10::DeviceIndex device, const at::Tensor& tensor) {
  auto dense = tensor.contiguous();
  return upload(device, dense.scalar_type(), dense.sizes().vec(), dense.data_ptr(), dense.nbytes());
}

ValuePtr float_value(c10::DeviceIndex device, double number, c10::ScalarType dtype) {
  auto scalar = at::scalar_tensor(number, at::TensorOptions().dtype(dtype));
  return upload(device, dtype, {}, scalar.data_ptr(), scalar.nbytes());
}

// Gives `tensor` a fresh storage of `sizes` (contiguous), as an `out=` of another size is
// resized; the storage's value is set by the write that follows.
void resize_for_write(const at::Tensor& tensor, const std::vector<int64_t>& sizes) {
  auto* impl = tensor.unsafeGetTensorImpl();
  size_t nbytes = static_cast<size_t>(c10::multiply_integers(sizes)) * tensor.itemsize();
  c10::DeviceGuard guard(tensor.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, allocator(), true);
  impl->set_storage_keep_dtype(std::move(storage));
  impl->set_storage_offset(0);
  impl->set_sizes_contiguous(sizes);
}

c10::IValue returned(const Return& r, Key& key, const std::vector<Source>& outputs,
                     c10::DeviceIndex device, int64_t count) {
  switch (r.kind) {
    case Return::kNew: {
      auto tensor = wrap(outputs[r.index], r.dtype, r.sizes, device);
      if (r.cut < 0) return tensor;
      // Cut along another dimension than the first, a part is no contiguous tensor, which the
      // op's result is.
      auto part = tensor.narrow(r.cut, 0, count);
      return r.cut == 0 ? part : part.contiguous();
    }
    case Return::kArgument:
      return key.device[r.index];
    case Return::kView: {
      const at::Tensor& base = key.device[r.index];
      if (r.dtype == base.scalar_type()) return base.as_strided(r.sizes, r.strides, r.offset);
      // A view in another dtype (view_as_complex, view_as_real): the same storage, read as it.
      auto impl = c10::make_intrusive<c10::TensorImpl>(
          c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(),
          c10::scalarTypeToTypeMeta(r.dtype));
      impl->set_sizes_and_strides(r.sizes, r.strides, r.offset);
      return at::Tensor(std::move(impl));
    }
    case Return::kList: {
      c10::List<at::Tensor> list;
      for (const auto& item : r.items) {
        list.push_back(returned(item, key, outputs, device, count).toTensor());
      }
      return list;
    }
    case Return::kValue:
      return r.value;
  }
  return {};
}

void execute(const c10::OperatorHandle& op, const std::shared_ptr<Entry>& entry, Key& key,
             torch::jit::Stack* stack, size_t arguments) {
  c10::DeviceIndex device = key.device.empty()
                                ? c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index()
                                : key.device.front().device().index();
  auto in_range = [&](size_t index, size_t size) {
    TORCH_CHECK(index < size, "tpuc: the plan of ", op.schema().name(),
                " does not fit its arguments (a bug in tpuc)");
  };
  std::vector<Source> outputs;
  if (entry->kind == Entry::kProgram) {
    // Fused mode records the op. An op whose result's size it reads back runs now, and so does
    // a random op: it draws its seed from torch's generator when it is called, so that
    // torch.manual_seed repeats it.
    bool record = recording() && entry->count_output < 0 && !entry->compiled.random && entry->graph >= 0;
    std::vector<Source> inputs;
    inputs.reserve(entry->inputs.size());
    for (const auto& input : entry->inputs) {
      switch (input.kind) {
        case Input::kTensor:
          in_range(input.index, key.device.size());
          inputs.push_back(record ? source_of(key.device[input.index])
                                  : Source(value_or_zeros(key.device[input.index])));
          break;
        case Input::kHost:
          in_range(input.index, key.host.size());
          inputs.push_back(host_value(device, key.host[input.index]));
          break;
        case Input::kFloat:
          in_range(input.index, key.floats.size());
          inputs.push_back(float_value(device, key.floats[input.index], input.dtype));
          break;
      }
    }
    if (record) {
      outputs = tpuc::record(entry, device, std::move(inputs));
    } else {
      std::vector<ValuePtr> values;
      values.reserve(inputs.size());
      for (auto& input : inputs) values.push_back(std::move(input.value));
      for (auto& value : launch(entry->compiled, device, std::move(values), op.schema().name().c_str())) {
        outputs.emplace_back(std::move(value));
      }
    }
  }
  for (const auto& write : entry->writes) {
    const at::Tensor& target = key.device[write.tensor];
    if (write.resize) resize_for_write(target, *write.resize);
    set_value(slot_of(target), outputs[write.output], write.dims, write.dtype);
  }
  int64_t count = 0;
  if (entry->count_output >= 0) {
    in_range(static_cast<size_t>(entry->count_output), outputs.size());
    download(*outputs[entry->count_output].value, &count, sizeof count);
  }
  std::vector<c10::IValue> results;
  results.reserve(entry->returns.size());
  for (const auto& r : entry->returns) results.push_back(returned(r, key, outputs, device, count));
  torch::jit::drop(*stack, arguments);
  for (auto& value : results) stack->push_back(std::move(value));
}

}  // namespace

std::vector<ValuePtr> launch(const Compiled& compiled, c10::DeviceIndex device,
                             std::vector<ValuePtr> inputs, const char* what) {
  inputs.insert(inputs.end(), compiled.constants.begin(), compiled.constants.end());
  std::vector<const Value*> raw_inputs;
  raw_inputs.reserve(inputs.size());
  for (const auto& value : inputs) raw_inputs.push_back(value.get());
  ValuePtr seed = compiled.random ? draw_seed(device) : nullptr;
  std::vector<Value*> results(compiled.results, nullptr);
  char* error = api().run(compiled.program.get(), static_cast<size_t>(device), raw_inputs.data(),
                          raw_inputs.size(), seed.get(), results.data(), results.size());
  std::vector<ValuePtr> owned;
  owned.reserve(results.size());
  for (auto* value : results) owned.push_back(value == nullptr ? nullptr : own(value));
  check(error, what);
  std::vector<ValuePtr> outputs;
  outputs.reserve(compiled.outputs.size());
  for (const auto& output : compiled.outputs) {
    size_t size = output.kind == Output::kResult ? owned.size() : inputs.size();
    TORCH_CHECK(static_cast<size_t>(output.index) < size, "tpuc: ", what,
                ": an output of its program out of range (a bug in tpuc)");
    outputs.push_back(output.kind == Output::kResult ? owned[output.index] : inputs[output.index]);
  }
  return outputs;
}

void set_planner(Planner planner, HostRunner host) {
  g_planner = std::move(planner);
  g_host = std::move(host);
}

namespace {
std::mutex g_debug_mutex;
DebugRunner g_debug;
std::atomic<bool> g_debugging{false};
// Whether this thread is inside a checked op (its checks' own ops run unchecked).
thread_local bool t_checking = false;

void run_unchecked(const c10::OperatorHandle& op, torch::jit::Stack* stack);
}  // namespace

void set_debug(DebugRunner runner) {
  std::lock_guard<std::mutex> lock(g_debug_mutex);
  g_debugging = static_cast<bool>(runner);
  g_debug = std::move(runner);
}

void run_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (g_debugging.load(std::memory_order_relaxed) && !t_checking) {
    DebugRunner runner;
    {
      std::lock_guard<std::mutex> lock(g_debug_mutex);
      runner = g_debug;
    }
    if (runner) {
      t_checking = true;
      struct Reset {
        ~Reset() { t_checking = false; }
      } reset;
      runner(op, stack, [&op, stack] { run_unchecked(op, stack); });
      return;
    }
  }
  run_unchecked(op, stack);
}

namespace {
void run_unchecked(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t arguments = schema.arguments().size();
  Key key;
  key.types.reserve(128);
  put(key.types, static_cast<const void*>(&schema));  // the op (its schema lives as long)
  for (const auto& value : torch::jit::last(*stack, arguments)) encode(key, value);
  auto entry = find(key);
  if (entry == nullptr) {
    TORCH_CHECK(g_planner, "the tpuc device is not initialised (import tpuc first)");
    ++g_misses;
    entry = g_planner(op, torch::jit::last(*stack, arguments),
                      std::string_view(key.types).substr(sizeof(const void*)), key.values);
    insert(key, entry);
  } else {
    ++g_hits;
  }
  if (entry->kind == Entry::kHost) {
    ++g_host_runs;
    g_host(op, stack);
    return;
  }
  execute(op, entry, key, stack, arguments);
}
}  // namespace

std::vector<c10::IValue> call(const char* name, const char* overload,
                              std::vector<c10::IValue> arguments) {
  static std::mutex handles_mutex;
  static std::unordered_map<std::string, c10::OperatorHandle> handles;
  std::string qualified = std::string(name) + "." + overload;
  std::optional<c10::OperatorHandle> op;
  {
    std::lock_guard<std::mutex> lock(handles_mutex);
    auto found = handles.find(qualified);
    if (found == handles.end()) {
      found = handles.emplace(qualified, c10::Dispatcher::singleton().findSchemaOrThrow(name, overload)).first;
    }
    op = found->second;
  }
  torch::jit::Stack stack(std::make_move_iterator(arguments.begin()),
                          std::make_move_iterator(arguments.end()));
  run_op(*op, &stack);
  return stack;
}

CacheStats cache_stats() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return {g_hits.load(), g_misses.load(), g_host_runs.load(), g_by_values.size() + g_by_types.size()};
}

void clear_cache() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_by_values.clear();
  g_by_types.clear();
}

}  // namespace tpuc
