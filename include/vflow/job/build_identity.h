// Which build a process of a job runs: the processes of a job on a cluster store (its
// submitter, node agents, workers started elsewhere) refuse to mix builds.
#pragma once

#include <string>

namespace vflow::job {

/// The version of the control records and the protocol the processes of a job speak;
/// raised whenever they change.
constexpr int kControlProtocol = 2;

/// "vflow <version> (control protocol <n>, LibTorch <x.y.z>, build <id>)": the library's
/// version, the protocol, the LibTorch it was built against and the GNU build id of the
/// engine's library (libvflow, beside the control plane's), so that two different builds
/// of one version differ too, and a node agent, which does not load the engine, names the
/// build of the workers it starts.
std::string build_identity();

}  // namespace vflow::job
