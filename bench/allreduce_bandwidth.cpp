// Sum-allreduce of float32 buffers between 2 processes on loopback: vflow's Gloo
// communicator against a raw c10d ProcessGroupGloo built on the same store,
// alternating per size, median of repeated calls.
//   allreduce_bandwidth [--sizes-mb 1,4,16,64] [--repeats 15]
#include <fmt/format.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/store.h"
#include "vflow/engine/runtime.h"
#include "vflow/vflow.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double time_ms(F f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int worker(int rank, const vflow::job::StoreHost& coordinator, int raw_port,
           const std::vector<int64_t>& sizes_mb, int repeats) {
  auto comm = vflow::comm::make_gloo_communicator(
      coordinator.rendezvous(rank, 2, "bench", std::chrono::seconds(30)));

  // The raw group meets through a c10d TCPStore of its own, as a plain c10d program does.
  auto store = vflow::comm::open_store("127.0.0.1", raw_port, std::chrono::seconds(30),
                                       /*server=*/false);
  auto gloo = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
  gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto raw = c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("raw", store), rank, 2, gloo);

  if (rank == 0) {
    std::cout << "| size MiB | vflow ms | raw c10d Gloo ms | vflow GB/s | raw GB/s |\n"
                 "|---|---|---|---|---|\n";
  }
  for (int64_t mb : sizes_mb) {
    auto t = torch::ones({mb * 1024 * 1024 / 4});
    std::vector<double> ours, theirs;
    for (int i = 0; i < repeats + 3; ++i) {
      const double a = time_ms([&] { comm->allreduce_sum(t); });
      std::vector<torch::Tensor> ts{t};
      const double b = time_ms([&] { raw->allreduce(ts)->wait(); });
      if (i >= 3) {
        ours.push_back(a);
        theirs.push_back(b);
      }
    }
    const double bytes = static_cast<double>(mb) * 1024 * 1024;
    if (rank == 0) {
      std::cout << fmt::format("| {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |\n", mb, median(ours),
                               median(theirs), bytes / median(ours) / 1e6,
                               bytes / median(theirs) / 1e6);
    }
  }
  comm->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"allreduce bandwidth: vflow's communicator against raw c10d Gloo"};
  std::vector<int64_t> sizes_mb = {1, 4, 16, 64};
  int repeats = 15;
  app.add_option("--sizes-mb", sizes_mb, "buffer sizes in MiB")->delimiter(',');
  app.add_option("--repeats", repeats, "timed calls per size");
  CLI11_PARSE(app, argc, argv);
  vflow::engine::set_intra_op_threads(1);
  vflow::job::StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(30));
  std::cout << "2 processes on loopback, float32 sum-allreduce, median of " << repeats
            << " calls per size (GB/s = buffer bytes / time)\n\n";
  std::cout.flush();
  const auto raw_store = vflow::comm::open_store("127.0.0.1", 0, std::chrono::seconds(30),
                                                 /*server=*/true);
  const int raw_port = raw_store->getPort();
  const pid_t child = fork();
  if (child == 0) _exit(worker(1, coordinator, raw_port, sizes_mb, repeats));
  const int rc = worker(0, coordinator, raw_port, sizes_mb, repeats);
  int status = 0;
  waitpid(child, &status, 0);
  return rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
