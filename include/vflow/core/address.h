// HOST:PORT, as vflow-train --coordinator, vflow-ctl and VFLOW_STORE take it.
#pragma once

#include <string>

namespace vflow {

struct HostPort {
  std::string host;
  int port = 0;
};

/// Parses "HOST:PORT" (the last colon splits, so "[::1]:29500" keeps its brackets off:
/// host "::1"). `what` names the input in the SpecError thrown for anything else, e.g.
/// "--coordinator must be HOST:PORT with a port of 1 to 65535, got 'x'".
HostPort parse_host_port(const std::string& text, const std::string& what);

/// A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick, released again
/// at once: whoever binds it next should do so soon). Throws Error when none can be had.
int free_loopback_port();

}  // namespace vflow
