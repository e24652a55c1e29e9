#include "fusion.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace tpuc {

struct Run {
  std::mutex mutex;  // held while it runs
  bool done = false;
  c10::DeviceIndex device = 0;
  std::vector<ValuePtr> inputs;  // the values its ops read, first use first
  std::unordered_map<const Value*, int> positions;  // a value's place in `inputs`
  std::vector<RecordedOp> ops;
  // Each output of its ops' graphs, by number: the pending value it makes (none where a graph
  // passes an input through).
  std::vector<std::weak_ptr<Pending>> outputs;
};

namespace {

// Guards the current run and the settings; a run that ends is taken out of it first and runs
// under its own mutex (so that a thread reading one of its values waits for it).
std::recursive_mutex g_mutex;
std::shared_ptr<Run> g_run;
std::atomic<bool> g_on{false};
size_t g_max_ops = 1000;
Fuser g_fuser;

std::mutex g_programs_mutex;
// Programs of runs by their structure (their ops' graphs, where each input comes from, what
// they return); null: the run's ops run one by one.
std::unordered_map<std::string, std::shared_ptr<const Compiled>> g_programs;
std::atomic<uint64_t> g_runs{0}, g_hits{0}, g_misses{0}, g_one_by_one{0};

template <typename T>
void put(std::string& text, T value) {
  text.append(reinterpret_cast<const char*>(&value), sizeof value);
}

std::shared_ptr<Run> take(const Run* only = nullptr) {
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  if (only != nullptr && g_run.get() != only) return nullptr;
  return std::move(g_run);
}

int input_of(Run& run, ValuePtr value) {
  auto [found, inserted] = run.positions.emplace(value.get(), static_cast<int>(run.inputs.size()));
  if (inserted) run.inputs.push_back(std::move(value));
  return -1 - found->second;
}

// Where `source` comes from in `run` (the current run, `g_mutex` held).
int source_in(Run& run, const Source& source) {
  if (source.pending != nullptr) {
    if (!source.pending->value && source.pending->run.lock().get() == &run) {
      return source.pending->number;
    }
    return input_of(run, resolve(*source.pending));
  }
  return input_of(run, source.value);
}

std::string message_of(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    return c10_error->what_without_backtrace();
  }
  return error.what();
}

// The run's ops one by one: the values numbered `live`.
std::vector<ValuePtr> one_by_one(const Run& run, const std::vector<int>& live) {
  std::vector<ValuePtr> numbered(run.outputs.size());
  size_t first = 0;
  for (const auto& op : run.ops) {
    std::vector<ValuePtr> inputs;
    inputs.reserve(op.sources.size());
    for (int source : op.sources) {
      inputs.push_back(source >= 0 ? numbered.at(source) : run.inputs.at(-1 - source));
    }
    auto outputs = launch(op.entry->compiled, run.device, std::move(inputs), "an op of a fused run");
    for (size_t k = 0; k < outputs.size(); ++k) numbered.at(first + k) = std::move(outputs[k]);
    first += outputs.size();
  }
  std::vector<ValuePtr> out;
  out.reserve(live.size());
  for (int number : live) out.push_back(numbered.at(number));
  return out;
}

void run_recorded(Run& run) {
  std::lock_guard<std::mutex> lock(run.mutex);
  if (run.done) return;
  run.done = true;
  std::vector<int> live;
  std::vector<std::shared_ptr<Pending>> pendings;
  for (size_t number = 0; number < run.outputs.size(); ++number) {
    if (auto pending = run.outputs[number].lock()) {
      live.push_back(static_cast<int>(number));
      pendings.push_back(std::move(pending));
    }
  }
  if (live.empty()) return;  // nothing it computes is referenced any more
  std::string key;
  put(key, run.device);
  for (const auto& op : run.ops) {
    put(key, op.entry->graph);
    put(key, op.sources.size());
    key.append(reinterpret_cast<const char*>(op.sources.data()), op.sources.size() * sizeof(int));
  }
  key.append(reinterpret_cast<const char*>(live.data()), live.size() * sizeof(int));
  try {
    std::shared_ptr<const Compiled> program;
    bool found = false;
    {
      std::lock_guard<std::mutex> programs_lock(g_programs_mutex);
      auto it = g_programs.find(key);
      if (it != g_programs.end()) {
        found = true;
        program = it->second;
      }
    }
    if (found) {
      ++g_hits;
    } else {
      ++g_misses;
      TORCH_CHECK(g_fuser, "the tpuc device is not initialised (import tpuc first)");
      program = g_fuser(run.ops, live, run.device);
      std::lock_guard<std::mutex> programs_lock(g_programs_mutex);
      g_programs.emplace(key, program);
    }
    std::vector<ValuePtr> values;
    if (program != nullptr) {
      std::string what = "a fused run of " + std::to_string(run.ops.size()) + " ops";
      values = launch(*program, run.device, run.inputs, what.c_str());
    } else {
      ++g_one_by_one;
      values = one_by_one(run, live);
    }
    for (size_t i = 0; i < pendings.size(); ++i) pendings[i]->value = std::move(values.at(i));
  } catch (const std::exception& error) {
    std::string message = message_of(error);
    for (auto& pending : pendings) pending->error = message;
    throw;
  }
}

}  // namespace

void set_fuser(Fuser fuser) {
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  g_fuser = std::move(fuser);
}

void set_fused(bool on, int max_ops) {
  TORCH_CHECK(max_ops > 0, "tpuc: fused mode's max_ops must be positive, not ", max_ops);
  if (!on) flush();
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  g_on = on;
  g_max_ops = static_cast<size_t>(max_ops);
}

bool recording() { return g_on.load(std::memory_order_relaxed); }

std::vector<Source> record(const std::shared_ptr<const Entry>& entry, c10::DeviceIndex device,
                           std::vector<Source> inputs) {
  std::shared_ptr<Run> ended;
  std::vector<Source> outputs;
  {
    std::lock_guard<std::recursive_mutex> lock(g_mutex);
    if (g_run != nullptr && g_run->device != device) ended = std::move(g_run);
  }
  if (ended != nullptr) run_recorded(*ended);  // a run is one device's
  {
    std::lock_guard<std::recursive_mutex> lock(g_mutex);
    if (g_run == nullptr) {
      g_run = std::make_shared<Run>();
      g_run->device = device;
      ++g_runs;
    }
    Run& run = *g_run;
    RecordedOp op{entry, {}};
    op.sources.reserve(inputs.size());
    for (const auto& input : inputs) op.sources.push_back(source_in(run, input));
    const Compiled& compiled = entry->compiled;
    outputs.reserve(compiled.outputs.size());
    for (const auto& output : compiled.outputs) {
      if (output.kind == Output::kInput) {  // passed through
        size_t index = static_cast<size_t>(output.index);
        outputs.push_back(index < inputs.size() ? inputs[index]
                                                : Source(compiled.constants.at(index - inputs.size())));
        run.outputs.emplace_back();
        continue;
      }
      auto pending = std::make_shared<Pending>();
      pending->run = g_run;
      pending->number = static_cast<int>(run.outputs.size());
      run.outputs.push_back(pending);
      outputs.emplace_back(std::move(pending));
    }
    run.ops.push_back(std::move(op));
    if (run.ops.size() >= g_max_ops) ended = std::move(g_run);
  }
  if (ended != nullptr) run_recorded(*ended);
  return outputs;
}

const ValuePtr& resolve(Pending& pending) {
  if (!pending.value) {
    if (auto run = pending.run.lock()) {
      auto current = take(run.get());  // the current run ends here, when it is this one
      run_recorded(*run);
    }
  }
  TORCH_CHECK(pending.value, "a tensor of the tpuc device has no value: the fused run that computes it failed",
              pending.error.empty() ? "" : " (" + pending.error + ")");
  return pending.value;
}

void flush() {
  if (auto run = take()) run_recorded(*run);
}

FusionStats fusion_stats() {
  std::lock_guard<std::mutex> lock(g_programs_mutex);
  return {g_runs.load(), g_hits.load(), g_misses.load(), g_one_by_one.load(), g_programs.size()};
}

void clear_fused_programs() {
  std::lock_guard<std::mutex> lock(g_programs_mutex);
  g_programs.clear();
}

}  // namespace tpuc
