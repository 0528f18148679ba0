#include "vflow/core/address.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "vflow/core/error.h"
#include "vflow/core/spec_node.h"

namespace vflow {

HostPort parse_host_port(const std::string& text, const std::string& what) {
  const auto fail = [&]() -> HostPort {
    throw SpecError(fmt::format("{} must be HOST:PORT with a port of 1 to 65535, got '{}'", what,
                                printable(text.substr(0, 200))));
  };
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) return fail();
  const std::string digits = text.substr(colon + 1);
  if (digits.size() > 5 || digits.find_first_not_of("0123456789") != std::string::npos) {
    return fail();
  }
  const int port = std::stoi(digits);
  if (port < 1 || port > 65535) return fail();
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return HostPort{host, port};
}

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(fmt::format("no free port: socket failed: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int error = errno;
  ::close(fd);
  if (!ok) throw Error(fmt::format("no free port: {}", std::strerror(error)));
  return ntohs(addr.sin_port);
}

}  // namespace vflow
