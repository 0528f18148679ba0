// vflow-ctl: control a running elastic job through its coordinator (HOST:PORT, as
// `vflow-train --workers K` prints it): status, resize, stop.
#include <CLI/CLI.hpp>
#include <iostream>

#include "vflow/comm/elastic.h"

namespace {

std::pair<std::string, int> parse_address(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    throw vflow::Error("the job address must be HOST:PORT, got '" + address + "'");
  }
  try {
    return {address.substr(0, colon), std::stoi(address.substr(colon + 1))};
  } catch (const std::exception&) {
    throw vflow::Error("the job address must be HOST:PORT, got '" + address + "'");
  }
}

void print_status(const vflow::comm::JobStatus& s) {
  std::cout << "state " << s.state << "\n"
            << "step " << s.step << "\n"
            << "generation " << s.generation.id << "\n"
            << "workers " << s.generation.members.size() << "\n"
            << "target " << s.target << "\n"
            << "limits " << s.limits.min_workers << ".." << s.limits.max_workers << " of "
            << s.limits.virtual_nodes << " virtual nodes\n";
  for (size_t rank = 0; rank < s.generation.members.size(); ++rank) {
    const auto& m = s.generation.members[rank];
    const auto pid = s.pids.find(m);
    std::cout << "rank " << rank << " worker " << m << " pid "
              << (pid == s.pids.end() ? -1 : pid->second) << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vflow-ctl: control a running elastic vflow job"};
  app.require_subcommand(1);
  std::string address;
  int64_t workers = 0;
  double timeout_s = 10;
  app.add_option("--timeout", timeout_s, "seconds to wait for the coordinator")
      ->check(CLI::PositiveNumber);
  auto* status = app.add_subcommand("status", "print the job's generation, step and workers");
  status->add_option("address", address, "the job's coordinator, HOST:PORT")->required();
  auto* resize = app.add_subcommand(
      "resize", "ask for K workers; takes effect at the next step boundary, no restart");
  resize->add_option("address", address, "the job's coordinator, HOST:PORT")->required();
  resize->add_option("workers", workers, "the new worker count")->required();
  auto* stop = app.add_subcommand(
      "stop", "stop every worker after the same step (rank 0 writes a checkpoint)");
  stop->add_option("address", address, "the job's coordinator, HOST:PORT")->required();
  CLI11_PARSE(app, argc, argv);

  try {
    const auto [host, port] = parse_address(address);
    vflow::comm::ControlPlane control(
        host, port, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    if (*status) {
      print_status(control.status());
    } else if (*resize) {
      control.request_resize(workers);
      std::cout << "resize to " << workers << " workers requested\n";
    } else if (*stop) {
      control.request_stop();
      std::cout << "stop requested\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
