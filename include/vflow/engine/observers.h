// The standard observers: evaluation, progress display, JSON-lines metrics and
// checkpoints. Each hangs off the trainer's hooks; none changes the trajectory.
#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "vflow/engine/trainer.h"

namespace vflow::core {
class AppendFile;
}

namespace vflow::engine {

/// Evaluates on the test split every k epochs / k steps and once at the end.
class EvaluationObserver final : public TrainingObserver {
 public:
  explicit EvaluationObserver(const EvaluationSpec& spec);
  void on_step_end(Trainer& trainer, const StepInfo& info) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch) override;
  void on_train_end(Trainer& trainer) override;

 private:
  void evaluate(Trainer& trainer);
  EvaluationSpec spec_;
  int64_t last_step_ = -1;
  bool waiting_ = false;  // a due evaluation waits for the parameters to be whole
};

/// A status line on a terminal ("bar") or periodic log lines ("lines").
class ProgressObserver final : public TrainingObserver {
 public:
  /// `mode` is bar, lines or auto (bar when stderr is a terminal).
  ProgressObserver(const std::string& mode, int64_t every_steps);
  void on_train_begin(Trainer& trainer) override;
  void on_step_end(Trainer& trainer, const StepInfo& info) override;
  void on_evaluation(Trainer& trainer, const EvalResult& result) override;
  void on_train_end(Trainer& trainer) override;

 private:
  bool bar_;
  int64_t every_steps_;
  int64_t first_step_ = 0;
  int64_t examples_ = 0;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

/// Appends one JSON object per line: {"event":"step"|"eval"|"end", ...}. A line that
/// cannot be written (a full disk) is dropped whole and logged, and training goes on.
class MetricsObserver final : public TrainingObserver {
 public:
  MetricsObserver(const std::string& path, int64_t every_steps);
  ~MetricsObserver() override;
  void on_step_end(Trainer& trainer, const StepInfo& info) override;
  void on_evaluation(Trainer& trainer, const EvalResult& result) override;
  void on_train_end(Trainer& trainer) override;

 private:
  void write(const std::string& line);
  std::string path_;
  std::unique_ptr<core::AppendFile> file_;
  bool failing_ = false;  ///< the last write failed (logged once until one succeeds)
  int64_t every_steps_;
  struct Window {  // sums since the last record
    int64_t examples = 0;
    int64_t steps = 0;
    double seconds = 0, compute = 0, sync = 0, update = 0;
    int64_t received = -1;  // bytes; -1: not counted
  } window_;
};

class TensorBoardWriter;

/// TensorBoard scalars (train/loss, train/lr, train/examples_per_second, eval/loss,
/// eval/accuracy) every k steps and at each evaluation, in an event file in `dir`
/// (created on the first record, so a worker that never leads writes none). Events that
/// cannot be written are dropped whole and logged, and training goes on.
class TensorBoardObserver final : public TrainingObserver {
 public:
  TensorBoardObserver(std::string dir, int64_t every_steps);
  ~TensorBoardObserver() override;
  void on_step_end(Trainer& trainer, const StepInfo& info) override;
  void on_evaluation(Trainer& trainer, const EvalResult& result) override;
  void on_train_end(Trainer& trainer) override;

 private:
  /// The writer, created on first use; nullptr when it cannot be (logged).
  TensorBoardWriter* writer();
  void flush();
  bool failing_ = false;
  std::string dir_;
  int64_t every_steps_;
  std::unique_ptr<TensorBoardWriter> writer_;
  int64_t examples_ = 0;
  double seconds_ = 0;
};

/// Writes checkpoints every k steps and at the end (also when stopped early). A periodic
/// checkpoint that cannot be written (a full disk) is logged as an error naming the file
/// and the cause, the previous checkpoint stays, and training goes on; the next one tries
/// again. The checkpoint at the end must succeed: its CheckpointError ends the run.
class CheckpointObserver final : public TrainingObserver {
 public:
  explicit CheckpointObserver(const CheckpointSpec& spec);
  void on_step_end(Trainer& trainer, const StepInfo& info) override;
  void on_train_end(Trainer& trainer) override;

 private:
  void save(Trainer& trainer);
  CheckpointSpec spec_;
  int64_t last_step_ = -1;
};

/// Forwards to another observer only while this worker is rank 0 (in an elastic job the
/// leader can change between generations). on_train_begin always reaches it.
class LeaderOnly final : public TrainingObserver {
 public:
  explicit LeaderOnly(std::shared_ptr<TrainingObserver> inner) : inner_(std::move(inner)) {}
  void on_train_begin(Trainer& trainer) override { inner_->on_train_begin(trainer); }
  void on_step_end(Trainer& trainer, const StepInfo& info) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch) override;
  void on_evaluation(Trainer& trainer, const EvalResult& result) override;
  void on_train_end(Trainer& trainer) override;

 private:
  std::shared_ptr<TrainingObserver> inner_;
};

/// Appends "step vnode index index ..." for every vnode of each completed step, as the
/// step's collective counted them (StepInfo::examples_used), one write per step: an audit
/// of exactly-once use of the data across resizes and failures, written by rank 0.
class ExampleLogObserver final : public TrainingObserver {
 public:
  explicit ExampleLogObserver(const std::string& path);
  ~ExampleLogObserver() override;
  /// Rank 0 appends the step's lines; every worker keeps the last step's lines.
  void on_step_end(Trainer& trainer, const StepInfo& info) override;
  /// In an elastic job a worker can complete a step that rank 0 did not (a peer died
  /// during its allreduce) and then hand its state to the next generation: the donor
  /// appends that step's lines when the file ends before it.
  void on_state_donated(Trainer& trainer) override;

 private:
  void append(const std::string& text);

  std::string path_;
  std::unique_ptr<core::AppendFile> file_;
  bool failing_ = false;
  int64_t last_step_ = -1;  ///< the step of last_lines_
  std::string last_lines_;
};

}  // namespace vflow::engine
