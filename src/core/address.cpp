#include "vflow/core/address.h"

#include <fmt/format.h>

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

}  // namespace vflow
