// The options of `--control etcd://...` (include/vflow/job/control_store.h), parsed in
// every build, with or without the etcd store itself.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "vflow/core/address.h"
#include "vflow/core/error.h"
#include "vflow/job/control_store.h"

namespace vflow::job {

namespace {

std::string environment(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

EtcdOptions etcd_options(const std::string& url, const std::string& job,
                         std::chrono::milliseconds timeout) {
  EtcdOptions o;
  std::string rest;
  if (url.rfind("etcd://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("etcds://", 0) == 0) {
    rest = url.substr(8);
    o.tls = true;
  } else {
    throw SpecError(fmt::format(
        "--control must be etcd://HOST:PORT,HOST:PORT,... or etcds://... (TLS), got '{}'", url));
  }
  std::stringstream parts(rest);
  for (std::string endpoint; std::getline(parts, endpoint, ',');) {
    const auto colon = endpoint.rfind(':');
    const bool port_ok =
        colon != std::string::npos && colon + 1 < endpoint.size() &&
        std::all_of(endpoint.begin() + static_cast<long>(colon) + 1, endpoint.end(),
                    [](unsigned char c) { return std::isdigit(c); });
    if (colon == 0 || !port_ok) {
      throw SpecError(fmt::format("--control: '{}' in '{}' is not HOST:PORT", endpoint, url));
    }
    o.endpoints.push_back(endpoint);
  }
  if (o.endpoints.empty()) throw SpecError(fmt::format("--control '{}' names no endpoint", url));
  const bool job_ok =
      !job.empty() && job.size() <= 128 && std::all_of(job.begin(), job.end(), [](unsigned char c) {
        return std::isalnum(c) || c == '-' || c == '_' || c == '.';
      });
  if (!job_ok || job == "." || job == "..") {
    throw SpecError(
        fmt::format("--job must be 1 to 128 letters, digits, '-', '_' or '.', got '{}'", job));
  }
  o.job = job;
  o.timeout = timeout;
  o.ca_file = environment("VFLOW_ETCD_CA");
  o.cert_file = environment("VFLOW_ETCD_CERT");
  o.key_file = environment("VFLOW_ETCD_KEY");
  // An unreadable certificate would look like members that cannot be reached, asked again
  // until the timeout: said now, naming the file.
  for (const auto& [variable, path] : etcd_tls_files(o)) {
    if (!std::ifstream(path)) {
      throw SpecError(fmt::format("{}: cannot read {}: {}", variable, path, std::strerror(errno)));
    }
  }
  if (o.cert_file.empty() != o.key_file.empty()) {
    throw SpecError("VFLOW_ETCD_CERT and VFLOW_ETCD_KEY go together: set both or neither");
  }
  o.user = environment("VFLOW_ETCD_USER");
  const auto password_file = environment("VFLOW_ETCD_PASSWORD_FILE");
  if (!password_file.empty()) {
    std::ifstream in(password_file);
    if (!in) {
      throw SpecError(fmt::format("VFLOW_ETCD_PASSWORD_FILE: cannot read {}: {}", password_file,
                                  std::strerror(errno)));
    }
    std::getline(in, o.password);
  }
  if (!o.user.empty() && o.password.empty()) {
    throw SpecError("VFLOW_ETCD_USER is set but VFLOW_ETCD_PASSWORD_FILE names no password");
  }
  return o;
}

std::vector<std::pair<std::string, std::string>> etcd_tls_files(const EtcdOptions& options) {
  std::vector<std::pair<std::string, std::string>> files;
  for (auto [variable, path] : {std::pair{"VFLOW_ETCD_CA", options.ca_file},
                                {"VFLOW_ETCD_CERT", options.cert_file},
                                {"VFLOW_ETCD_KEY", options.key_file}}) {
    if (!path.empty()) files.emplace_back(variable, path);
  }
  return files;
}

bool is_cluster_store(const std::string& address) {
  return address.rfind("etcd://", 0) == 0 || address.rfind("etcds://", 0) == 0;
}

std::unique_ptr<ControlStore> connect_control_store(const std::string& address,
                                                    const std::string& job,
                                                    std::chrono::milliseconds timeout) {
  if (is_cluster_store(address)) return connect_etcd_store(etcd_options(address, job, timeout));
  const auto where = parse_host_port(address, "the job's store");
  return connect_embedded_store(where.host, where.port, timeout);
}

std::unique_ptr<ClusterStore> connect_cluster_store(const std::string& address,
                                                    const std::string& job,
                                                    std::chrono::milliseconds timeout) {
  if (!is_cluster_store(address)) {
    throw SpecError(
        fmt::format("'{}' is not a cluster control store (etcd://... or etcds://...)", address));
  }
  return connect_etcd_store(etcd_options(address, job, timeout));
}

std::string control_store_host(const std::string& address) {
  if (!is_cluster_store(address)) return parse_host_port(address, "the job's store").host;
  const auto first = etcd_options(address, "job", std::chrono::milliseconds(1)).endpoints.front();
  return parse_host_port(first, "the etcd endpoint").host;
}

}  // namespace vflow::job
