// vflow-train: train a job spec. Parse, validate, build, run, map the outcome to an exit code.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <iostream>

#include "vflow/vflow.h"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) {
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

enum ExitCode {
  kOk = 0,
  kFailure = 1,
  kBadSpec = 2,
  kBadData = 3,
  kBadCheckpoint = 4,
  kStopped = 130
};
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "vflow-train: train a model with virtual nodes; the result depends on the job spec only"};
  std::string spec_path;
  std::vector<std::string> overrides;
  std::string resume;
  bool print_spec = false;
  bool check_only = false;
  app.add_option("job", spec_path, "job spec (YAML); the built-in default job when omitted");
  app.add_option("--set", overrides, "override a key, e.g. --set semantic.seed=7 (repeatable)");
  app.add_option("--resume", resume,
                 "resume from a checkpoint file, or 'latest' in output.checkpoint.dir");
  app.add_flag("--print-spec", print_spec, "print the effective semantic part and exit");
  app.add_flag("--check", check_only, "validate the job spec and exit");
  CLI11_PARSE(app, argc, argv);

  try {
    if (!resume.empty()) overrides.push_back("output.checkpoint.resume=" + resume);
    const auto spec = vflow::engine::load_job_spec(spec_path, overrides);
    spdlog::set_level(spdlog::level::from_str(spec.output.logging.level));
    spdlog::set_pattern("[%H:%M:%S] %v");
    if (print_spec) {
      std::cout << spec.semantic_yaml();
      return kOk;
    }
    if (check_only) {
      std::cout << spec.source << ": valid\n";
      return kOk;
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    vflow::engine::JobRunOptions options;
    options.stop_flag = &g_stop;
    const auto result = vflow::engine::run_job(spec, options);
    if (result.evaluation) {
      std::cout << "test accuracy " << 100.0 * result.evaluation->accuracy << "% after "
                << result.evaluation->step << " steps\n";
    }
    std::cout << "fingerprint " << result.fingerprint << "\n";
    if (!result.completed) {
      spdlog::warn("[train] stopped at step {} by a signal", result.steps);
      return kStopped;
    }
    return kOk;
  } catch (const vflow::SpecError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kBadSpec;
  } catch (const vflow::DataError& e) {
    std::cerr << "data error: " << e.what() << "\n";
    return kBadData;
  } catch (const vflow::CheckpointError& e) {
    std::cerr << "checkpoint error: " << e.what() << "\n";
    return kBadCheckpoint;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kFailure;
  }
}
