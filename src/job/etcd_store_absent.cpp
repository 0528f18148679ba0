// A build without libcurl or nlohmann-json has no etcd control store (CMake's
// VFLOW_WITH_ETCD): --control etcd://... is refused with this message.
#include "vflow/core/error.h"
#include "vflow/job/agent.h"
#include "vflow/job/control_store.h"

namespace vflow::job {

namespace {
const char* const kWithout =
    "this vflow was built without the etcd control store (libcurl and nlohmann-json were not "
    "found at build time; Debian: libcurl4-openssl-dev nlohmann-json3-dev)";
}  // namespace

std::vector<std::string> etcd_jobs(const EtcdOptions& options) { throw Error(kWithout); }

std::unique_ptr<ClusterStore> connect_etcd_store(const EtcdOptions& options) {
  throw Error(kWithout);
}

std::unique_ptr<ClusterStore> connect_etcd_root(const EtcdOptions& options) {
  throw Error(kWithout);
}

int run_agent(const AgentOptions& options) { throw Error(kWithout); }

}  // namespace vflow::job
