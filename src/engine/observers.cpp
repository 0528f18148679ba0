#include "vflow/engine/observers.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/output_file.h"
#include "vflow/core/error.h"
#include "vflow/engine/checkpoint.h"
#include "vflow/engine/tensorboard.h"

namespace vflow::engine {

namespace {
using Clock = std::chrono::steady_clock;

/// Wall-clock time, comparable across processes (for records several workers write).
double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A JSON number; NaN and infinities (a diverged run) have no JSON form and become null.
std::string json_number(double value) {
  return std::isfinite(value) ? fmt::format("{:.6g}", value) : std::string("null");
}

std::string duration_text(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}
}  // namespace

// ---- evaluation -----------------------------------------------------------------

EvaluationObserver::EvaluationObserver(const EvaluationSpec& spec) : spec_(spec) {}

void EvaluationObserver::evaluate(Trainer& trainer) {
  if (last_step_ == trainer.step()) return;
  if (!trainer.parameters_complete()) {
    // A sharded job's gather of the parameters failed in this step: they are whole again
    // once the group regrouped, and the evaluation is taken at the first step end after.
    if (!waiting_) {
      spdlog::info("[eval] the evaluation due after step {} waits until the parameters are whole",
                   trainer.step());
    }
    waiting_ = true;
    return;
  }
  waiting_ = false;
  last_step_ = trainer.step();
  trainer.publish_evaluation(trainer.evaluate());
}

void EvaluationObserver::on_step_end(Trainer& trainer, const StepInfo& info) {
  if (waiting_ || (spec_.every_steps > 0 && (info.step + 1) % spec_.every_steps == 0)) {
    evaluate(trainer);
  }
}

void EvaluationObserver::on_epoch_end(Trainer& trainer, int64_t epoch) {
  if (spec_.every_epochs > 0 && (epoch + 1) % spec_.every_epochs == 0) evaluate(trainer);
}

void EvaluationObserver::on_train_end(Trainer& trainer) { evaluate(trainer); }

// ---- progress --------------------------------------------------------------------

ProgressObserver::ProgressObserver(const std::string& mode, int64_t every_steps)
    : bar_(mode == "bar" || (mode == "auto" && ::isatty(STDERR_FILENO))),
      every_steps_(every_steps) {}

void ProgressObserver::on_train_begin(Trainer& trainer) {
  first_step_ = trainer.step();
  examples_ = 0;
  start_ = last_draw_ = Clock::now();
}

void ProgressObserver::on_step_end(Trainer& trainer, const StepInfo& info) {
  examples_ += info.examples;
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int64_t done = info.step + 1;
  const double rate = elapsed > 0 ? static_cast<double>(examples_) / elapsed : 0;
  const double steps_per_second =
      elapsed > 0 ? static_cast<double>(done - first_step_) / elapsed : 0;
  const double eta =
      steps_per_second > 0 ? static_cast<double>(info.total_steps - done) / steps_per_second : 0;
  const int64_t epochs = (info.total_steps + info.steps_per_epoch - 1) / info.steps_per_epoch;
  if (bar_) {
    // Redraw at most 10 times a second, but always at an epoch's end (an evaluation may follow).
    const bool must = done == info.total_steps || done % info.steps_per_epoch == 0;
    if (!must && std::chrono::duration<double>(now - last_draw_).count() < 0.1) return;
    last_draw_ = now;
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * done / info.total_steps);
    std::fprintf(stderr,
                 "\r\033[Kepoch %lld/%lld step %lld/%lld [%s%s] loss %.4f lr %.4g %.0f ex/s ETA %s",
                 static_cast<long long>(info.epoch + 1), static_cast<long long>(epochs),
                 static_cast<long long>(done), static_cast<long long>(info.total_steps),
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(kWidth - filled), '.').c_str(), info.loss, info.lr,
                 rate, duration_text(eta).c_str());
    std::fflush(stderr);
    line_open_ = true;
  } else if (done % every_steps_ == 0 || done == info.total_steps) {
    spdlog::info("[train] epoch {}/{} step {}/{} loss {:.4f} lr {:.4g} {:.0f} examples/s ETA {}",
                 info.epoch + 1, epochs, done, info.total_steps, info.loss, info.lr, rate,
                 duration_text(eta));
  }
}

void ProgressObserver::on_evaluation(Trainer& trainer, const EvalResult& result) {
  if (line_open_) {
    std::fputc('\n', stderr);
    line_open_ = false;
  }
  spdlog::info("[eval] step {}: test accuracy {:.2f}% loss {:.4f} ({} examples)", result.step,
               100.0 * result.accuracy, result.loss, result.examples);
}

void ProgressObserver::on_train_end(Trainer& trainer) {
  if (line_open_) {
    std::fputc('\n', stderr);
    line_open_ = false;
  }
}

// ---- metrics -------------------------------------------------------------------------

namespace {
/// Logs the first failed write of an output file, and the first success after it: a full
/// disk gives two lines, not one per step.
void note_write(const std::string& what, const std::string& path, const std::string& error,
                bool& failing) {
  if (!error.empty() && !failing) {
    spdlog::error(
        "[engine] {} {}: cannot write: {}; its records are dropped until writes "
        "succeed again, training goes on",
        what, path, error);
  } else if (error.empty() && failing) {
    spdlog::info("[engine] {} {}: writing again", what, path);
  }
  failing = !error.empty();
}
}  // namespace

MetricsObserver::MetricsObserver(const std::string& path, int64_t every_steps)
    : path_(path), file_(std::make_unique<core::AppendFile>(path)), every_steps_(every_steps) {
  if (!file_->is_open()) {
    throw SpecError(fmt::format("output.logging.metrics: cannot open '{}' for writing: {}", path,
                                file_->error()));
  }
}

MetricsObserver::~MetricsObserver() = default;

void MetricsObserver::write(const std::string& line) {
  note_write("metrics file", path_, file_->append(line + "\n"), failing_);
}

void MetricsObserver::on_step_end(Trainer& trainer, const StepInfo& info) {
  window_.examples += info.examples;
  window_.steps += 1;
  window_.seconds += info.seconds;
  window_.compute += info.compute_seconds;
  window_.sync += info.sync_seconds;
  window_.update += info.update_seconds;
  if (info.received_bytes >= 0)
    window_.received = std::max<int64_t>(window_.received, 0) + info.received_bytes;
  const int64_t done = info.step + 1;
  if (done % every_steps_ != 0 && done != info.total_steps) return;
  const double steps = static_cast<double>(window_.steps);
  write(fmt::format(
      R"({{"event":"step","step":{},"epoch":{},"loss":{},"lr":{},"examples_per_second":{:.1f},)"
      R"("compute_ms":{:.3f},"sync_ms":{:.3f},"update_ms":{:.3f},"workers":{},"time":{:.6f}{}{}{}{}}})",
      done, info.epoch, json_number(info.loss), json_number(info.lr),
      window_.seconds > 0 ? static_cast<double>(window_.examples) / window_.seconds : 0.0,
      1e3 * window_.compute / steps, 1e3 * window_.sync / steps, 1e3 * window_.update / steps,
      info.workers, unix_seconds(),
      info.grad_norm ? fmt::format(R"(,"grad_norm":{})", json_number(*info.grad_norm)) : "",
      info.replaced_examples > 0 ? fmt::format(R"(,"replaced":{})", info.replaced_examples) : "",
      info.optimizer_state_bytes >= 0
          ? fmt::format(R"(,"optimizer_state_mb":{:.3f})", info.optimizer_state_bytes / 1e6)
          : "",
      window_.received >= 0 ? fmt::format(R"(,"received_mb":{:.3f})",
                                          static_cast<double>(window_.received) / 1e6 / steps)
                            : ""));
  window_ = Window{};
}

void MetricsObserver::on_evaluation(Trainer& trainer, const EvalResult& result) {
  write(fmt::format(R"({{"event":"eval","step":{},"accuracy":{},"loss":{},"examples":{}}})",
                    result.step, json_number(result.accuracy), json_number(result.loss),
                    result.examples));
}

void MetricsObserver::on_train_end(Trainer& trainer) {
  write(fmt::format(R"({{"event":"end","step":{},"fingerprint":"{}"}})", trainer.step(),
                    trainer.fingerprint()));
}

// ---- TensorBoard -----------------------------------------------------------------------

TensorBoardObserver::TensorBoardObserver(std::string dir, int64_t every_steps)
    : dir_(std::move(dir)), every_steps_(every_steps) {}

TensorBoardObserver::~TensorBoardObserver() = default;

TensorBoardWriter* TensorBoardObserver::writer() {
  if (!writer_) {
    try {
      writer_ = std::make_unique<TensorBoardWriter>(dir_);
    } catch (const Error& e) {
      note_write("TensorBoard directory", dir_, e.what(), failing_);
      return nullptr;
    }
  }
  return writer_.get();
}

void TensorBoardObserver::flush() {
  note_write("TensorBoard event file", writer_->path(), writer_->try_flush(), failing_);
}

void TensorBoardObserver::on_step_end(Trainer& trainer, const StepInfo& info) {
  examples_ += info.examples;
  seconds_ += info.seconds;
  const int64_t done = info.step + 1;
  if (done % every_steps_ != 0 && done != info.total_steps) return;
  const bool timed = seconds_ > 0;
  const double examples_per_second = timed ? examples_ / seconds_ : 0;
  examples_ = 0;
  seconds_ = 0;
  auto* w = writer();
  if (!w) return;
  w->scalar("train/loss", done, info.loss);
  w->scalar("train/lr", done, info.lr);
  if (timed) w->scalar("train/examples_per_second", done, examples_per_second);
  flush();
}

void TensorBoardObserver::on_evaluation(Trainer& trainer, const EvalResult& result) {
  auto* w = writer();
  if (!w) return;
  w->scalar("eval/loss", result.step, result.loss);
  w->scalar("eval/accuracy", result.step, result.accuracy);
  flush();
}

void TensorBoardObserver::on_train_end(Trainer& trainer) {
  if (writer_) flush();
}

// ---- checkpoints -----------------------------------------------------------------------

CheckpointObserver::CheckpointObserver(const CheckpointSpec& spec) : spec_(spec) {}

void CheckpointObserver::save(Trainer& trainer) {
  if (last_step_ == trainer.step()) return;
  const std::string path = checkpoint_path(spec_.dir, trainer.step());
  trainer.save_checkpoint(path);
  last_step_ = trainer.step();
  prune_checkpoints(spec_.dir, spec_.keep);
  spdlog::info("[checkpoint] wrote {}", path);
}

void CheckpointObserver::on_step_end(Trainer& trainer, const StepInfo& info) {
  if (spec_.every_steps <= 0 || (info.step + 1) % spec_.every_steps != 0) return;
  try {
    save(trainer);
  } catch (const CheckpointError& e) {
    // Stopping here would lose everything trained since the last checkpoint; the
    // checkpoint at the end must succeed and tries again.
    spdlog::error("[checkpoint] {}; earlier checkpoints are kept and training goes on", e.what());
  }
}

void CheckpointObserver::on_train_end(Trainer& trainer) { save(trainer); }

void LeaderOnly::on_step_end(Trainer& trainer, const StepInfo& info) {
  if (trainer.rank() == 0) inner_->on_step_end(trainer, info);
}
void LeaderOnly::on_epoch_end(Trainer& trainer, int64_t epoch) {
  if (trainer.rank() == 0) inner_->on_epoch_end(trainer, epoch);
}
void LeaderOnly::on_evaluation(Trainer& trainer, const EvalResult& result) {
  if (trainer.rank() == 0) inner_->on_evaluation(trainer, result);
}
void LeaderOnly::on_train_end(Trainer& trainer) {
  if (trainer.rank() == 0) inner_->on_train_end(trainer);
}

ExampleLogObserver::ExampleLogObserver(const std::string& path)
    : path_(path), file_(std::make_unique<core::AppendFile>(path)) {
  if (!file_->is_open()) {
    throw SpecError(fmt::format("output.logging.examples: cannot open '{}' for writing: {}", path,
                                file_->error()));
  }
}

ExampleLogObserver::~ExampleLogObserver() = default;

namespace {

/// The step of the last line of an example log, or -1 for an empty file; reads the
/// file's tail only.
int64_t last_logged_step(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw Error(
        fmt::format("output.logging.examples: cannot read {}: {}", path, std::strerror(errno)));
  }
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw Error(
        fmt::format("output.logging.examples: cannot stat {}: {}", path, std::strerror(errno)));
  }
  if (st.st_size == 0) return -1;
  // The file ends with a newline; find the one before the last line.
  off_t end = st.st_size - 1;
  off_t start = end;
  char buffer[4096];
  while (start > 0) {
    const off_t from = std::max<off_t>(0, start - static_cast<off_t>(sizeof buffer));
    const auto n = ::pread(fd, buffer, static_cast<size_t>(start - from), from);
    if (n <= 0) break;
    const auto* nl = static_cast<const char*>(memrchr(buffer, '\n', static_cast<size_t>(n)));
    if (nl) {
      start = from + (nl - buffer) + 1;
      break;
    }
    start = from;
  }
  char head[32] = {};
  const auto n = ::pread(fd, head, std::min<off_t>(sizeof head - 1, end - start), start);
  if (n <= 0) {
    throw Error(fmt::format("output.logging.examples: cannot read the end of {}", path));
  }
  return std::strtoll(head, nullptr, 10);
}

}  // namespace

void ExampleLogObserver::on_step_end(Trainer& trainer, const StepInfo& info) {
  last_lines_.clear();
  for (const auto& [vnode, indices] : info.examples_used) {
    last_lines_ += fmt::format("{} {} {}\n", info.step, vnode, fmt::join(indices, " "));
  }
  last_step_ = info.step;
  if (trainer.rank() == 0) append(last_lines_);
}

void ExampleLogObserver::on_state_donated(Trainer&) {
  if (last_step_ < 0 || last_lines_.empty()) return;
  int64_t logged = 0;
  try {
    logged = last_logged_step(path_);
  } catch (const Error& e) {  // an audit file must not stop the job
    spdlog::warn("[engine] {}; step {} may be missing from it", e.what(), last_step_);
    return;
  }
  if (logged != last_step_ - 1) return;  // rank 0 logged it (or this worker is behind)
  spdlog::info("[engine] {}: step {} was completed here but not logged by rank 0; logging it",
               path_, last_step_);
  append(last_lines_);
}

void ExampleLogObserver::append(const std::string& text) {
  // One append per step: lines of concurrent workers never interleave.
  if (!text.empty()) note_write("examples audit", path_, file_->append(text), failing_);
}

}  // namespace vflow::engine
