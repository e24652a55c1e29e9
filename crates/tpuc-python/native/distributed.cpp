// The device's torch.distributed backend ("tpuc"): every collective runs on an existing engine
// that owns the transport (gloo on the host), never on one of tpuc's own. Device tensors are
// read to the host for it once, and the tensors a collective writes get the host's results back;
// host tensors pass straight through. A collective runs on the engine's threads while the caller
// goes on (as on CUDA, its results are there once its work is waited on); gloo's own errors and
// timeouts (a rank that died, a peer that never came) surface at the wait.
#include "distributed.h"

#include <ATen/core/ivalue.h>
#include <c10/util/hash.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <sstream>
#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

namespace tpuc {
namespace {

constexpr const char* kName = "tpuc";

bool on_device(const at::Tensor& tensor) { return tensor.device().type() == c10::DeviceType::PrivateUse1; }

// What the backend did: collectives started, the bytes of the tensors handed to them, and the
// bytes it copied from the device for the engine and back to the device from it.
std::atomic<uint64_t> g_collectives{0}, g_tensor_bytes{0}, g_to_host_bytes{0}, g_to_device_bytes{0};

// A collective's tensors as the host engine sees them, and the results it writes, copied back
// into the device tensors they came from once the engine is done.
class Staging {
 public:
  // `tensor` for the engine to read (and write when `written`).
  at::Tensor read(const at::Tensor& tensor, bool written) {
    g_tensor_bytes += tensor.nbytes();
    if (!on_device(tensor)) return tensor;
    g_to_host_bytes += tensor.nbytes();
    auto host = tensor.to(c10::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
    if (written) writes_.emplace_back(tensor, host);
    return host;
  }

  // A host tensor like `tensor` for the engine to write only.
  at::Tensor write(const at::Tensor& tensor) {
    g_tensor_bytes += tensor.nbytes();
    if (!on_device(tensor)) return tensor;
    auto host = at::empty(tensor.sizes(), tensor.options().device(c10::kCPU));
    writes_.emplace_back(tensor, host);
    return host;
  }

  std::vector<at::Tensor> read_all(const std::vector<at::Tensor>& tensors, bool written) {
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) out.push_back(read(t, written));
    return out;
  }

  std::vector<at::Tensor> write_all(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) out.push_back(write(t));
    return out;
  }

  std::vector<std::vector<at::Tensor>> write_lists(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<std::vector<at::Tensor>> out;
    out.reserve(lists.size());
    for (const auto& list : lists) out.push_back(write_all(list));
    return out;
  }

  std::vector<std::vector<at::Tensor>> read_lists(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<std::vector<at::Tensor>> out;
    out.reserve(lists.size());
    for (const auto& list : lists) out.push_back(read_all(list, false));
    return out;
  }

  // The caller's work: the engine's `work`, whose results reach the device tensors when it is
  // waited on; `results` are the caller's tensors, as the engine's work would give them.
  c10::intrusive_ptr<c10d::Work> finish(c10::intrusive_ptr<c10d::Work> work, std::vector<at::Tensor> results);

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> writes_;
};

// A collective under way on the host engine. Waiting for it (as torch does for a synchronous
// call, and the caller of an asynchronous one must) copies the results to the device on the
// waiting thread: the device's ops are never run from the engine's threads.
class StagedWork final : public c10d::Work {
 public:
  StagedWork(c10::intrusive_ptr<c10d::Work> host, std::vector<std::pair<at::Tensor, at::Tensor>> writes,
             std::vector<at::Tensor> results)
      : Work(-1, host->retrieveOpType()), host_(std::move(host)), writes_(std::move(writes)),
        results_(std::move(results)) {}

  bool wait(std::chrono::milliseconds timeout) override {
    host_->wait(timeout);
    std::lock_guard<std::mutex> lock(copy_mutex_);
    if (!copied_) {
      for (auto& [device, host] : writes_) {
        device.copy_(host);
        g_to_device_bytes += host.nbytes();
      }
      writes_.clear();
      copied_ = true;
    }
    return true;
  }
  void synchronize() override { wait(kNoTimeout); }
  bool isCompleted() override {
    if (!host_->isCompleted()) return false;
    if (host_->isSuccess()) wait(kNoTimeout);
    return true;
  }
  bool isSuccess() const override { return host_->isSuccess(); }
  std::exception_ptr exception() const override { return host_->exception(); }
  int sourceRank() const override { return host_->sourceRank(); }
  std::vector<at::Tensor> result() override { return results_; }
  void abort() override { host_->abort(); }
  uint64_t getSequencenumber() const override { return host_->getSequencenumber(); }
  // A future completed with the results once they are on the device (waiting for them now).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    wait(kNoTimeout);
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(results_));
    return future;
  }

 private:
  c10::intrusive_ptr<c10d::Work> host_;
  std::mutex copy_mutex_;
  std::vector<std::pair<at::Tensor, at::Tensor>> writes_;
  std::vector<at::Tensor> results_;
  bool copied_ = false;
};

c10::intrusive_ptr<c10d::Work> Staging::finish(c10::intrusive_ptr<c10d::Work> work, std::vector<at::Tensor> results) {
  ++g_collectives;
  return c10::make_intrusive<StagedWork>(std::move(work), std::move(writes_), std::move(results));
}

// What a rank's collective is, for the check that every rank calls the same one on alike tensors.
std::string describe(const std::string& op, const std::vector<at::Tensor>& tensors, int64_t root = -1) {
  std::ostringstream out;
  out << op;
  if (root >= 0) out << " from rank " << root;
  out << " of";
  for (size_t i = 0; i < tensors.size(); ++i) {
    out << (i ? ", " : " ") << c10::getDtypeNames(tensors[i].scalar_type()).first << tensors[i].sizes();
  }
  if (tensors.empty()) out << " nothing";
  return out.str();
}

std::string reduction(const char* op, const c10d::ReduceOp& reduce) {
  static const char* names[] = {"sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum"};
  auto index = static_cast<size_t>(reduce.op_);
  return std::string(op) + " (" + (index < std::size(names) ? names[index] : "unknown op") + ")";
}

// gloo sums but does not pre-multiply (FSDP2 reduce-scatters gradients with a divide factor as
// `premul_sum`): the staged tensors are multiplied by the factor here and gloo sums them. A
// tensor is multiplied in place where it is the backend's own copy or the collective overwrites
// it anyway; a host tensor the collective only reads is replaced by a multiplied copy.
c10d::ReduceOp premultiplied(const c10d::ReduceOp& reduce, std::vector<at::Tensor>& staged,
                             const std::vector<at::Tensor>& originals, bool written) {
  if (reduce.op_ != c10d::ReduceOp::PREMUL_SUM) return reduce;
  auto* supplement = dynamic_cast<c10d::PreMulSumSupplement*>(reduce.supplement_.get());
  TORCH_CHECK(supplement != nullptr, "tpuc: a premul_sum reduction without its factor");
  for (size_t i = 0; i < staged.size(); ++i) {
    auto& tensor = staged[i];
    bool own = written || on_device(originals[i]);
    if (supplement->tensor_factor.defined()) {
      auto factor = supplement->tensor_factor.to(c10::kCPU);
      tensor = own ? tensor.mul_(factor) : tensor.mul(factor);
    } else {
      tensor = own ? tensor.mul_(supplement->double_factor) : tensor.mul(supplement->double_factor);
    }
  }
  return c10d::ReduceOp(c10d::ReduceOp::SUM);
}

template <class Options>
Options summing(Options opts, std::vector<at::Tensor>& staged, const std::vector<at::Tensor>& originals,
                bool written) {
  opts.reduceOp = premultiplied(opts.reduceOp, staged, originals, written);
  return opts;
}

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& list : lists) out.insert(out.end(), list.begin(), list.end());
  return out;
}

class DeviceBackend final : public c10d::Backend {
 public:
  DeviceBackend(c10::intrusive_ptr<c10d::Backend> host, std::chrono::milliseconds timeout)
      : Backend(host->getRank(), host->getSize()),
        host_(std::move(host)),
        options_(c10::make_intrusive<Options>(kName, timeout)) {}

  const std::string getBackendName() const override { return kName; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  void setTimeout(std::chrono::milliseconds timeout) override {
    options_->timeout = timeout;
    host_->setTimeout(timeout);
  }
  c10d::ErrorType getError() override { return host_->getError(); }
  void abort() override { host_->abort(); }
  void shutdown() override { host_->shutdown(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    agree(describe("broadcast", tensors, opts.rootRank));
    Staging staging;
    auto host = staging.read_all(tensors, /*written=*/rank_ != opts.rootRank);
    return staging.finish(host_->broadcast(host, opts), tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    agree(describe(reduction("all_reduce", opts.reduceOp), tensors));
    Staging staging;
    auto host = staging.read_all(tensors, true);
    return staging.finish(host_->allreduce(host, summing(opts, host, tensors, true)), tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    agree(describe(reduction("all_reduce_coalesced", opts.reduceOp), tensors));
    Staging staging;
    auto host = staging.read_all(tensors, true);
    return staging.finish(host_->allreduce_coalesced(host, summing(opts, host, tensors, true)), tensors);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    agree(describe(reduction("reduce", opts.reduceOp), tensors, opts.rootRank));
    Staging staging;
    auto host = staging.read_all(tensors, /*written=*/rank_ == opts.rootRank);
    return staging.finish(host_->reduce(host, summing(opts, host, tensors, rank_ == opts.rootRank)), tensors);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    agree(describe("all_gather", inputs));
    Staging staging;
    auto host_in = staging.read_all(inputs, false);
    auto host_out = staging.write_lists(outputs);
    return staging.finish(host_->allgather(host_out, host_in, opts), flat(outputs));
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    agree(describe("all_gather_into_tensor", {input}));
    Staging staging;
    auto host_in = staging.read(input, false);
    auto host_out = staging.write(output);
    return staging.finish(host_->_allgather_base(host_out, host_in, opts), {output});
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    agree(describe("all_gather_coalesced", inputs));
    Staging staging;
    auto host_in = staging.read_all(inputs, false);
    auto host_out = staging.write_lists(outputs);
    return staging.finish(host_->allgather_coalesced(host_out, host_in, opts), flat(outputs));
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    agree(describe("all_gather_into_tensor_coalesced", inputs));
    Staging staging;
    auto host_in = staging.read_all(inputs, false);
    auto host_out = staging.write_all(outputs);
    return staging.finish(host_->allgather_into_tensor_coalesced(host_out, host_in, opts), outputs);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    agree(describe("gather", inputs, opts.rootRank));
    Staging staging;
    auto host_in = staging.read_all(inputs, false);
    auto host_out = staging.write_lists(outputs);
    return staging.finish(host_->gather(host_out, host_in, opts), flat(outputs));
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    agree(describe("scatter", outputs, opts.rootRank));
    Staging staging;
    auto host_in = staging.read_lists(inputs);
    auto host_out = staging.write_all(outputs);
    return staging.finish(host_->scatter(host_out, host_in, opts), outputs);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    agree(describe(reduction("reduce_scatter", opts.reduceOp), outputs));
    Staging staging;
    auto host_in = staging.read_lists(inputs);
    auto host_out = staging.write_all(outputs);
    auto summed = opts;
    for (size_t i = 0; i < host_in.size(); ++i) summed = summing(opts, host_in[i], inputs[i], false);
    return staging.finish(host_->reduce_scatter(host_out, host_in, summed), outputs);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    agree(describe(reduction("reduce_scatter_tensor", opts.reduceOp), {input}));
    Staging staging;
    std::vector<at::Tensor> host_in{staging.read(input, false)};
    auto host_out = staging.write(output);
    auto summed = summing(opts, host_in, {input}, false);
    return staging.finish(host_->_reduce_scatter_base(host_out, host_in[0], summed), {output});
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    agree(describe(reduction("reduce_scatter_tensor_coalesced", opts.reduceOp), inputs));
    Staging staging;
    auto host_in = staging.read_all(inputs, false);
    auto host_out = staging.write_all(outputs);
    auto summed = summing(opts, host_in, inputs, false);
    return staging.finish(host_->reduce_scatter_tensor_coalesced(host_out, host_in, summed), outputs);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    // Uneven splits make the ranks' tensors differ: only the dtype must agree then.
    agree(output_splits.empty() && input_splits.empty() ? describe("all_to_all_single", {input})
          : "all_to_all_single with splits of " + std::string(c10::getDtypeNames(input.scalar_type()).first));
    Staging staging;
    auto host_in = staging.read(input, false);
    auto host_out = staging.write(output);
    return staging.finish(host_->alltoall_base(host_out, host_in, output_splits, input_splits, opts), {output});
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    agree("all_to_all of " + std::to_string(inputs.size()) + " tensors");
    Staging staging;
    auto host_in = staging.read_all(inputs, false);
    auto host_out = staging.write_all(outputs);
    return staging.finish(host_->alltoall(host_out, host_in, opts), outputs);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    Staging staging;
    auto host = staging.read_all(tensors, false);
    return staging.finish(host_->send(host, dst, tag), tensors);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    Staging staging;
    auto host = staging.write_all(tensors);
    return staging.finish(host_->recv(host, src, tag), tensors);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    Staging staging;
    auto host = staging.write_all(tensors);
    return staging.finish(host_->recvAnysource(host, tag), tensors);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    agree("barrier");
    return host_->barrier(opts);
  }

  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    host_->monitoredBarrier(opts, wait_all_ranks);
  }

 private:
  // Every rank must call the same collective on tensors of the same shapes and dtypes: gloo
  // aborts the process or hangs otherwise. Each rank's description (its hash, and its text as
  // far as it fits) is gathered first, and a mismatch is an error naming every rank's call.
  void agree(const std::string& call) {
    constexpr size_t kBytes = 256;
    auto mine = at::zeros({static_cast<int64_t>(kBytes)}, at::kByte);
    uint64_t hash = c10::hash<std::string>()(call);
    std::memcpy(mine.data_ptr(), &hash, sizeof(hash));
    std::memcpy(static_cast<char*>(mine.data_ptr()) + sizeof(hash), call.data(),
                std::min(call.size(), kBytes - sizeof(hash) - 1));
    auto all = at::empty({static_cast<int64_t>(kBytes) * size_}, at::kByte);
    host_->_allgather_base(all, mine, c10d::AllgatherOptions())->wait();
    bool same = true;
    for (int r = 0; r < size_; ++r) {
      same = same && std::memcmp(all.data_ptr<uint8_t>() + r * kBytes, &hash, sizeof(hash)) == 0;
    }
    if (same) return;
    std::ostringstream out;
    out << "tpuc: the ranks of process group '" << (getGroupDesc().empty() ? getGroupUid() : getGroupDesc()) << "' called different collectives "
        << "(each rank must call the same one on tensors of the same shapes and dtypes):";
    for (int r = 0; r < size_; ++r) {
      const char* text = reinterpret_cast<const char*>(all.data_ptr<uint8_t>() + r * kBytes + sizeof(uint64_t));
      out << "\n  rank " << r << (r == rank_ ? " (this one)" : "") << ": " << text;
    }
    TORCH_CHECK(false, out.str());
  }

  c10::intrusive_ptr<c10d::Backend> host_;
  c10::intrusive_ptr<Options> options_;
};

// DDP's reducer times its phases with a timer for its parameters' device type: the host's clock
// serves, a collective being done when its call returns.
class HostClockTimer final : public c10d::Timer {
 public:
  explicit HostClockTimer(c10::Device) {}
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    auto from = getTimestamp(start);
    auto to = getTimestamp(end);
    if (!from || !to || *to < *from) return std::nullopt;
    return *to - *from;
  }
};

}  // namespace

void register_distributed(pybind11::module_& m) {
  namespace py = pybind11;
  static bool registered = false;
  if (registered) return;
  registered = true;
  // c10d's Backend class is torch's (torch._C._distributed_c10d), imported before this runs.
  py::class_<DeviceBackend, c10d::Backend, c10::intrusive_ptr<DeviceBackend>>(
      m, "DeviceBackend", "The tpuc device's torch.distributed backend over a host backend (gloo).");
  m.def("distributed_stats", []() {
        py::dict out;
        out["collectives"] = g_collectives.load();
        out["tensor_bytes"] = g_tensor_bytes.load();
        out["to_host_bytes"] = g_to_host_bytes.load();
        out["to_device_bytes"] = g_to_device_bytes.load();
        return out;
      }, "What the device's torch.distributed backend did in this process: collectives started, the "
         "bytes of the tensors handed to them, the bytes it copied to the host for gloo and back.");
  m.def("device_backend", [](const c10::intrusive_ptr<c10d::Backend>& host, std::chrono::milliseconds timeout) {
        return c10::make_intrusive<DeviceBackend>(host, timeout);
      }, py::arg("host"), py::arg("timeout"),
      "The device's backend running each collective on `host` (a gloo backend of the same ranks).");
}

}  // namespace tpuc

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, tpuc::HostClockTimer);
}  // namespace c10d
