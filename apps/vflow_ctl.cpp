// vflow-ctl: control a running elastic job through its coordinator (HOST:PORT, as
// `vflow-train --workers K` prints it), or by name on a cluster's etcd (--control):
// status, resize, stop; list shows every job on etcd.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "command_line.h"
#include "vflow/core/address.h"
#include "vflow/job/agent.h"
#include "vflow/job/control_plane.h"
#include "vflow/job/control_store.h"

namespace {

void print_status(const vflow::job::JobStatus& s) {
  std::cout << "state " << to_string(s.state) << "\n"
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
  CLI::App app{
      "vflow-ctl: control a running elastic vflow job\n"
      "exit codes: 0 done, 2 usage error, 5 coordinator unreachable, 7 request refused"};
  app.require_subcommand(1);
  std::string address;
  std::string control_url;
  int64_t workers = 0;
  double timeout_s = 10;
  app.add_option("--timeout", timeout_s, "seconds to wait for the coordinator")
      ->check(vflow::apps::positive_number());
  app.add_option("--control", control_url,
                 "the cluster control store the job runs on, etcd://HOST:PORT,... (etcds:// for "
                 "TLS; credentials: VFLOW_ETCD_*); the address is then the job's name");
  auto* status = app.add_subcommand("status", "print the job's generation, step and workers");
  status
      ->add_option("address", address,
                   "the job's coordinator, HOST:PORT (with --control: the job's name)")
      ->required();
  auto* resize = app.add_subcommand(
      "resize", "ask for K workers; takes effect at the next step boundary, no restart");
  resize
      ->add_option("address", address,
                   "the job's coordinator, HOST:PORT (with --control: the job's name)")
      ->required();
  resize->add_option("workers", workers, "the new worker count")
      ->required()
      ->check(vflow::apps::at_least(1));
  auto* stop = app.add_subcommand(
      "stop", "stop every worker after the same step (rank 0 writes a checkpoint)");
  stop->add_option("address", address,
                   "the job's coordinator, HOST:PORT (with --control: the job's name)")
      ->required();
  auto* list = app.add_subcommand(
      "list", "with --control: every job on the etcd cluster, with its state, step and workers");
  auto* agents = app.add_subcommand(
      "agents", "with --control: every node agent, its host, its slots and what runs on them");
  if (const int code = vflow::apps::parse_command_line(app, argc, argv); code >= 0) return code;

  return vflow::apps::run_reporting_errors([&]() -> int {
    const std::chrono::milliseconds timeout(static_cast<int64_t>(timeout_s * 1000));
    if (*agents) {
      if (control_url.empty()) throw vflow::SpecError("agents needs --control etcd://...");
      const auto root =
          vflow::job::connect_etcd_root(vflow::job::etcd_options(control_url, "job", timeout));
      for (const auto& a : vflow::job::read_agents(*root)) {
        std::cout << fmt::format("{} host {} pid {} slots {}{}\n", a.name, a.host, a.pid,
                                 a.slots.size(), a.draining ? " stopping" : "");
        for (size_t slot = 0; slot < a.slots.size(); ++slot) {
          const auto taken = a.taken.find(static_cast<int64_t>(slot));
          std::cout << fmt::format("  slot {} {} {}\n", slot, a.slots[slot],
                                   taken == a.taken.end() ? "free" : "job " + taken->second);
        }
      }
      return vflow::kExitOk;
    }
    if (*list) {
      if (control_url.empty()) throw vflow::SpecError("list needs --control etcd://...");
      for (const auto& name :
           vflow::job::etcd_jobs(vflow::job::etcd_options(control_url, "job", timeout))) {
        vflow::job::ControlPlane job(vflow::job::connect_control_store(control_url, name, timeout));
        const auto s = job.status();
        std::cout << fmt::format("{} state {} step {} generation {} workers {}\n", name,
                                 to_string(s.state), s.step, s.generation.id,
                                 s.generation.members.size());
      }
      return vflow::kExitOk;
    }
    vflow::job::ControlPlane control(
        control_url.empty() ? vflow::job::connect_control_store(address, "", timeout)
                            : vflow::job::connect_control_store(control_url, address, timeout));
    if (!control_url.empty()) control.require_job(address, control_url);
    if (*status) {
      print_status(control.status());
      if (!control_url.empty()) {
        const auto holder =
            vflow::job::connect_cluster_store(control_url, address, timeout)->holder("coordinator");
        std::cout << "coordinator " << holder.value_or("none") << "\n";
      }
    } else if (*resize) {
      control.request_resize(workers);
      std::cout << "resize to " << workers << " workers requested\n";
    } else if (*stop) {
      control.request_stop();
      std::cout << "stop requested\n";
    }
    return vflow::kExitOk;
  });
}
