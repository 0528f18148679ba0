#include "job/child_processes.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "vflow/core/error.h"
#include "vflow/core/process.h"

namespace vflow::job {

namespace {

void forward_lines(std::string& buffer, const char* data, size_t n, const std::string& prefix,
                   FILE* sink, bool flush_all) {
  buffer.append(data, n);
  size_t start = 0;
  while (true) {
    const size_t nl = buffer.find('\n', start);
    if (nl == std::string::npos) break;
    std::fprintf(sink, "%s%.*s\n", prefix.c_str(), static_cast<int>(nl - start),
                 buffer.data() + start);
    start = nl + 1;
  }
  buffer.erase(0, start);
  if (flush_all && !buffer.empty()) {
    std::fprintf(sink, "%s%s\n", prefix.c_str(), buffer.c_str());
    buffer.clear();
  }
  std::fflush(sink);
}

}  // namespace

void ChildProcesses::start(const Start& worker) {
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  const auto close_all = [&] {
    for (const int fd : {out[0], out[1], err[0], err[1]}) {
      if (fd >= 0) close(fd);
    }
  };
  // Close-on-exec: no later child inherits this worker's pipes (dup2 clears the flag on
  // the child's own standard streams).
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    close_all();
    throw Error(fmt::format("pipe failed: {}", std::strerror(e)));
  }
  Child c;
  c.name = worker.name;
  c.prefix = worker.prefix.empty() ? fmt::format("[worker {}] ", worker.name) : worker.prefix;
  SpawnOptions spawn;
  spawn.command = worker.command;
  spawn.environment = worker.environment;
  spawn.stdout_fd = out[1];
  spawn.stderr_fd = err[1];
  spawn.working_directory = worker.working_directory;
  spawn.parent_death_signal = worker.parent_death_signal;
  spawn.run_as_user = worker.run_as_user;
  try {
    c.pid = spawn_process(spawn);
  } catch (...) {
    close_all();
    throw;
  }
  close(out[1]);
  close(err[1]);
  c.out = out[0];
  c.err = err[0];
  children_.push_back(std::move(c));
}

bool ChildProcesses::pump(int wait_ms) {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, bool>> owners;  // (child, is_stdout)
  for (size_t i = 0; i < children_.size(); ++i) {
    if (children_[i].out >= 0) {
      fds.push_back({children_[i].out, POLLIN, 0});
      owners.emplace_back(i, true);
    }
    if (children_[i].err >= 0) {
      fds.push_back({children_[i].err, POLLIN, 0});
      owners.emplace_back(i, false);
    }
  }
  if (fds.empty()) {
    if (wait_ms > 0) usleep(static_cast<useconds_t>(wait_ms) * 1000);
    return !all_reaped();
  }
  poll(fds.data(), fds.size(), wait_ms);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    auto& c = children_[owners[i].first];
    const bool is_out = owners[i].second;
    char buf[8192];
    const ssize_t n = read(fds[i].fd, buf, sizeof buf);
    int& fd = is_out ? c.out : c.err;
    std::string& line_buf = is_out ? c.out_buf : c.err_buf;
    FILE* sink = is_out ? stdout : stderr;
    if (n > 0) {
      forward_lines(line_buf, buf, static_cast<size_t>(n), c.prefix, sink, false);
    } else {
      forward_lines(line_buf, buf, 0, c.prefix, sink, true);
      close(fd);
      fd = -1;
    }
  }
  return true;
}

std::vector<std::pair<std::string, int>> ChildProcesses::reap() {
  std::vector<std::pair<std::string, int>> ended;
  for (auto& c : children_) {
    if (!c.running) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.running = false;
      ended.emplace_back(c.name, exit_code_of_status(status));
    }
  }
  return ended;
}

void ChildProcesses::signal_all(int sig) {
  for (auto& c : children_) {
    if (c.running) kill(c.pid, sig);
  }
}

void ChildProcesses::signal(const std::string& name, int sig) {
  for (auto& c : children_) {
    if (c.running && c.name == name) kill(c.pid, sig);
  }
}

size_t ChildProcesses::running() const {
  return static_cast<size_t>(
      std::count_if(children_.begin(), children_.end(), [](const Child& c) { return c.running; }));
}

bool ChildProcesses::all_reaped() const {
  return std::none_of(children_.begin(), children_.end(),
                      [](const Child& c) { return c.running || c.out >= 0 || c.err >= 0; });
}

}  // namespace vflow::job
