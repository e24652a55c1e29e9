// Fused mode: programs of ops are recorded, not run, and each recorded run becomes one program
// (the fuser, Python, joins the ops' graphs and compiles them; cached here by the run's
// structure, so the same steps of a loop run one program without entering Python). A run ends
// when a value it computes is read, at `flush` (synchronizing, an optimizer step), when an op
// of another device comes, and after `max_ops` ops. Its program returns the values still
// referenced when it ends; the rest stay inside it, where XLA fuses them away.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops.h"
#include "storage.h"

namespace tpuc {

struct Run;

// A value a recorded op makes: output `number` of its run, `value` once the run has run.
struct Pending {
  std::weak_ptr<Run> run;
  int number = 0;
  ValuePtr value;
  std::string error;  // why its run failed, if it did
};

// A recorded op: its entry and where each input of its graph comes from: output `s` (>= 0) of
// the run, or the run's input `-1 - s`.
struct RecordedOp {
  std::shared_ptr<const Entry> entry;
  std::vector<int> sources;
};

// The fuser: the program of a run's `ops` on `device` returning its outputs `returned`; null
// when they cannot be one program (its ops then run one by one).
using Fuser = std::function<std::shared_ptr<const Compiled>(
    const std::vector<RecordedOp>& ops, const std::vector<int>& returned, c10::DeviceIndex device)>;
void set_fuser(Fuser fuser);

// Fused mode on (recording runs of at most `max_ops` ops) or off (what was recorded runs).
void set_fused(bool on, int max_ops);
bool recording();

// Records `entry`'s program on `device` run on its graph's `inputs`: its graph's outputs.
std::vector<Source> record(const std::shared_ptr<const Entry>& entry, c10::DeviceIndex device,
                           std::vector<Source> inputs);

// The value of `pending` (its run runs first if it has not).
const ValuePtr& resolve(Pending& pending);

// Runs what was recorded.
void flush();

struct FusionStats {
  uint64_t runs = 0, hits = 0, misses = 0, one_by_one = 0, programs = 0;
};
FusionStats fusion_stats();
void clear_fused_programs();

}  // namespace tpuc
