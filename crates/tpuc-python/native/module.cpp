// The Python module `tpuc._tpuc_native`: connects the device to the runtime (`init`), and is the
// bridge to the planner, which traces and compiles an op on its first call of a key (Python
// runs only then, and for ops that run on the host).
#include <torch/csrc/Dtype.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

#include "distributed.h"
#include "fusion.h"
#include "generator.h"
#include "ops.h"
#include "storage.h"

namespace py = pybind11;

namespace tpuc {
void register_hooks();

namespace {

// The Python planner (`plan(...)`, `run_on_host(...)`) and fuser (`fusion.fuse`); never released:
// a static's destructor would run after the interpreter is gone.
py::object* g_planner = nullptr;
py::object* g_fuser = nullptr;

constexpr const char* kValueCapsule = "tpuc._tpuc.DeviceValue";
constexpr const char* kProgramCapsule = "tpuc._tpuc.Loaded";
constexpr const char* kTargetCapsule = "tpuc._tpuc.Target";
constexpr const char* kApiCapsule = "tpuc._tpuc.NativeApi";

void* capsule_pointer(const py::handle& capsule, const char* name) {
  void* pointer = PyCapsule_GetPointer(capsule.ptr(), name);
  if (pointer == nullptr) throw py::error_already_set();
  return pointer;
}

ValuePtr value_of_capsule(const py::handle& capsule) {
  return share(static_cast<const Value*>(capsule_pointer(capsule, kValueCapsule)));
}

py::capsule value_capsule(const ValuePtr& value) {
  Value* handle = api().clone_value(value.get());
  return py::capsule(handle, kValueCapsule, [](PyObject* capsule) {
    auto* pointer = PyCapsule_GetPointer(capsule, kValueCapsule);
    if (pointer != nullptr && ready()) api().release_value(static_cast<Value*>(pointer));
  });
}

c10::ScalarType dtype_of(const py::handle& object) {
  TORCH_CHECK(THPDtype_Check(object.ptr()), "tpuc: the planner gave a dtype that is not one");
  return reinterpret_cast<THPDtype*>(object.ptr())->scalar_type;
}

std::vector<int64_t> ints(const py::handle& object) { return object.cast<std::vector<int64_t>>(); }

Return parse_return(const py::handle& item, const c10::TypePtr& type) {
  auto spec = item.cast<py::tuple>();
  auto kind = spec[0].cast<std::string>();
  Return r;
  if (kind == "new") {
    r.kind = Return::kNew;
    r.index = spec[1].cast<int>();
    r.dtype = dtype_of(spec[2]);
    r.sizes = ints(spec[3]);
    if (spec.size() > 4 && !spec[4].is_none()) r.cut = spec[4].cast<int64_t>();
  } else if (kind == "arg") {
    r.kind = Return::kArgument;
    r.index = spec[1].cast<int>();
  } else if (kind == "view") {
    r.kind = Return::kView;
    r.index = spec[1].cast<int>();
    r.sizes = ints(spec[2]);
    r.strides = ints(spec[3]);
    r.offset = spec[4].cast<int64_t>();
    r.dtype = dtype_of(spec[5]);
  } else if (kind == "list") {
    r.kind = Return::kList;
    for (const auto& sub : spec[1]) r.items.push_back(parse_return(sub, nullptr));
  } else if (kind == "value") {
    TORCH_CHECK(type != nullptr, "tpuc: the planner returned a value inside a list");
    r.kind = Return::kValue;
    r.value = torch::jit::toIValue(spec[1], type);
  } else {
    TORCH_CHECK(false, "tpuc: the planner returned an unknown kind of result: ", kind);
  }
  return r;
}

// (program, constants, outputs, results, random): a compiled graph (planner.py).
Compiled parse_compiled(const py::handle& item) {
  auto spec = item.cast<py::tuple>();
  Compiled compiled;
  compiled.program = share(static_cast<const Program*>(capsule_pointer(spec[0], kProgramCapsule)));
  for (const auto& constant : spec[1]) compiled.constants.push_back(value_of_capsule(constant));
  for (const auto& output : spec[2]) {
    auto pair = output.cast<py::tuple>();
    auto output_kind = pair[0].cast<std::string>();
    compiled.outputs.push_back({output_kind == "input" ? Output::kInput : Output::kResult,
                               pair[1].cast<int>()});
  }
  compiled.results = spec[3].cast<size_t>();
  compiled.random = spec[4].cast<bool>();
  return compiled;
}

std::shared_ptr<Entry> parse_plan(const c10::OperatorHandle& op, const py::tuple& plan) {
  auto entry = std::make_shared<Entry>();
  auto kind = plan[0].cast<std::string>();
  const auto& returns = op.schema().returns();
  auto parse_returns = [&](const py::handle& items) {
    size_t i = 0;
    for (const auto& item : items) {
      entry->returns.push_back(parse_return(item, i < returns.size() ? returns[i].type() : nullptr));
      ++i;
    }
  };
  if (kind == "host") {
    entry->kind = Entry::kHost;
    return entry;
  }
  if (kind == "view") {
    entry->kind = Entry::kView;
    parse_returns(plan[1]);
    return entry;
  }
  TORCH_CHECK(kind == "program", "tpuc: the planner returned an unknown plan: ", kind);
  entry->compiled = parse_compiled(plan[1]);
  for (const auto& item : plan[2]) {
    auto spec = item.cast<py::tuple>();
    auto input_kind = spec[0].cast<std::string>();
    Input input{Input::kTensor, spec[1].cast<int>()};
    if (input_kind == "host") {
      input.kind = Input::kHost;
    } else if (input_kind == "float") {
      input.kind = Input::kFloat;
      input.dtype = dtype_of(spec[2]);
    } else {
      TORCH_CHECK(input_kind == "tensor", "tpuc: unknown input kind ", input_kind);
    }
    entry->inputs.push_back(input);
  }
  for (const auto& item : plan[3]) {
    auto spec = item.cast<py::tuple>();
    Write write{spec[0].cast<int>(), spec[1].cast<int>(), ints(spec[2]), dtype_of(spec[3]),
                std::nullopt};
    if (!spec[4].is_none()) write.resize = ints(spec[4]);
    entry->writes.push_back(std::move(write));
  }
  parse_returns(plan[4]);
  entry->lifted = plan[5].cast<bool>();
  if (!plan[6].is_none()) entry->count_output = plan[6].cast<int>();
  entry->graph = plan[7].cast<int64_t>();
  return entry;
}

py::list python_arguments(c10::ArrayRef<c10::IValue> arguments) {
  py::list out;
  for (const auto& value : arguments) out.append(torch::jit::toPyObject(value));
  return out;
}

std::shared_ptr<Entry> plan(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                            std::string_view types, std::string_view values) {
  py::gil_scoped_acquire gil;
  const auto& schema = op.schema();
  py::object plan = g_planner->attr("plan")(schema.name(), schema.overload_name(),
                                           python_arguments(arguments), py::bytes(types.data(), types.size()),
                                           py::bytes(values.data(), values.size()));
  return parse_plan(op, plan.cast<py::tuple>());
}

std::shared_ptr<const Compiled> fuse(const std::vector<RecordedOp>& ops, const std::vector<int>& returned,
                                     c10::DeviceIndex device) {
  py::gil_scoped_acquire gil;
  py::list described;
  for (const auto& op : ops) described.append(py::make_tuple(op.entry->graph, py::tuple(py::cast(op.sources))));
  py::object program = (*g_fuser)(described, py::cast(returned), static_cast<int>(device));
  if (program.is_none()) return nullptr;
  return std::make_shared<const Compiled>(parse_compiled(program));
}

void run_on_host(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t count = schema.arguments().size();
  std::vector<c10::IValue> results;
  {
    py::gil_scoped_acquire gil;
    py::object result = g_planner->attr("run_on_host")(
        schema.name(), schema.overload_name(), python_arguments(torch::jit::last(*stack, count)));
    const auto& returns = schema.returns();
    if (returns.size() == 1) {
      results.push_back(torch::jit::toIValue(result, returns[0].type()));
    } else if (returns.size() > 1) {
      auto items = result.cast<py::tuple>();
      for (size_t i = 0; i < returns.size(); ++i) {
        results.push_back(torch::jit::toIValue(items[i], returns[i].type()));
      }
    }
  }
  torch::jit::drop(*stack, count);
  for (auto& value : results) stack->push_back(std::move(value));
}

// Debug mode's Python runner (`checks.run`); never released (see `g_planner`).
py::object* g_debug_runner = nullptr;

void debug_run(const c10::OperatorHandle& op, torch::jit::Stack* stack,
               const std::function<void()>& run) {
  const auto& schema = op.schema();
  py::gil_scoped_acquire gil;
  py::list arguments = python_arguments(torch::jit::last(*stack, schema.arguments().size()));
  py::cpp_function proceed([&op, stack, &run]() {
    {
      py::gil_scoped_release release;
      run();
    }
    py::list results;
    for (const auto& value : torch::jit::last(*stack, op.schema().returns().size())) {
      results.append(torch::jit::toPyObject(value));
    }
    return results;
  });
  (*g_debug_runner)(schema.name(), schema.overload_name(), arguments, proceed);
}

void set_debug_runner(py::object runner) {
  if (runner.is_none()) {
    set_debug(nullptr);
    return;
  }
  if (g_debug_runner == nullptr) g_debug_runner = new py::object();
  *g_debug_runner = std::move(runner);
  set_debug(debug_run);
}

void init(const py::capsule& api_capsule, const py::capsule& target_capsule, int devices,
          std::vector<int> element_codes, py::object planner, py::object fuser) {
  auto* table = static_cast<const Api*>(capsule_pointer(api_capsule, kApiCapsule));
  auto* target = static_cast<const Target*>(capsule_pointer(target_capsule, kTargetCapsule));
  set_runtime(table, target, devices, std::move(element_codes));
  if (g_planner == nullptr) g_planner = new py::object();
  *g_planner = std::move(planner);
  if (g_fuser == nullptr) g_fuser = new py::object();
  *g_fuser = std::move(fuser);
  set_planner(plan, run_on_host);
  set_fuser(fuse);
  register_hooks();
}

py::list scalar_types() {
  py::list out;
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    auto type = static_cast<c10::ScalarType>(i);
    PyObject* dtype = nullptr;
    try {
      dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(type));
    } catch (const c10::Error&) {
      // a ScalarType torch has no Python dtype for
    }
    out.append(dtype == nullptr ? py::none() : py::reinterpret_borrow<py::object>(dtype));
  }
  return out;
}

py::tuple storage_layout(const at::Tensor& tensor) {
  const Slot& slot = slot_of(tensor);
  py::object dtype = py::none(), dims = py::none();
  if (written(slot)) {
    dims = py::cast(slot.dims);
    dtype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(slot.dtype)));
  }
  return py::make_tuple(dims, dtype, slot.nbytes);
}

}  // namespace
}  // namespace tpuc

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace tpuc;
  m.doc() = "The tpuc device's native layer (PrivateUse1 kernels over tpuc's runtime).";
  m.attr("torch_version") = TPUC_TORCH_VERSION;  // the torch whose ABI it has
  m.def("init", &init, "Connects the device to the runtime, the planner and the fuser.");
  m.def("scalar_types", &scalar_types, "torch's dtypes by their ScalarType number.");
  m.def("storage_layout", &storage_layout,
        "(dims, dtype, nbytes) of a device tensor's storage value; dims None when unwritten.");
  m.def("dense_value", [](const at::Tensor& tensor) {
        ValuePtr value;
        {
          py::gil_scoped_release release;  // a fused run may run first, which may need the fuser
          value = value_or_zeros(dense(tensor));
        }
        return value_capsule(value);
      }, "A handle to a device tensor's elements as a value of its shape (its storage's own when "
         "it is the whole of it).");
  m.def("wrap", [](const py::capsule& value, py::object dtype, std::vector<int64_t> sizes, int device) {
        return wrap(value_of_capsule(value), dtype_of(dtype), sizes, static_cast<c10::DeviceIndex>(device));
      }, "A new tensor of the device holding a value of the runtime.");
  m.def("cache_stats", []() {
        auto ops = cache_stats();
        auto runs = fusion_stats();
        py::dict out;
        out["hits"] = ops.hits;
        out["misses"] = ops.misses;
        out["host_runs"] = ops.host_runs;
        out["entries"] = ops.entries;
        out["fused_runs"] = runs.runs;
        out["fused_hits"] = runs.hits;
        out["fused_misses"] = runs.misses;
        out["fused_one_by_one"] = runs.one_by_one;
        out["fused_programs"] = runs.programs;
        auto uploads = upload_stats();
        out["uploads"] = uploads.uploads;
        out["uploaded_bytes"] = uploads.bytes;
        return out;
      }, "What the cache of ops' entries and fused mode's cache of runs' programs did, and the "
         "copies from the host to the device.");
  m.def("clear_cache", []() {
        clear_cache();
        clear_fused_programs();
      });
  m.def("set_fused", &set_fused, py::call_guard<py::gil_scoped_release>(),
        "Fused mode on (runs of at most max_ops ops recorded, each one program) or off.");
  m.def("flush", &flush, py::call_guard<py::gil_scoped_release>(), "Runs what fused mode recorded.");
  m.def("set_debug_runner", &set_debug_runner,
        "Debug mode: every op runs through runner(name, overload, arguments, proceed), where "
        "proceed() runs it and returns its results; None ends it.");
  m.def("shutdown", &shutdown,
        "Stops releasing values into the runtime (at interpreter exit, when the plugin may be "
        "gone before the last tensors).");
  m.def("random_state", [](int device) {
        auto state = random_state(static_cast<c10::DeviceIndex>(device));
        return std::make_pair(state.seed, state.offset);
      }, "(seed, offset): device number `device`'s random state.");
  m.def("set_random_state", [](int device, uint64_t seed, uint64_t offset) {
        set_random_state(static_cast<c10::DeviceIndex>(device), {seed, offset});
      }, "Sets device number `device`'s random state.");
  m.def("enable_distributed", [m]() mutable { register_distributed(m); },
        "Defines the device's torch.distributed backend (once torch.distributed is imported).");
  m.def("synchronize", []() {
        flush();
        synchronize();
      }, py::call_guard<py::gil_scoped_release>(), "Runs what fused mode recorded and waits for the devices.");
}
