// What the multi-process tests share: the small job they train and output parsing.
#pragma once

#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace vflow::testing {

inline const std::string kTrain = VFLOW_TRAIN_BINARY;
inline const std::string kCtl = VFLOW_CTL_BINARY;
// ConvNet with batch norm and dropout, N = 12 vnodes of 4.
inline const std::string kJob =
    " --set semantic.data='{name: synthetic, options: {train_size: 600, test_size: 64, shape: [1, "
    "12, 12], "
    "classes: 4, noise: 1.5}}'"
    " --set semantic.model.options='{channels: [4, 8], hidden: 16, dropout: 0.25}'"
    " --set semantic.global_batch=48 --set semantic.virtual_nodes=12 --set semantic.steps=16"
    " --set semantic.epochs=null --set resources.threads=1 --set resources.timeout_s=20"
    " --set output.logging.progress=off";
inline const std::string kDeterministic = " --set semantic.deterministic=true";

/// Every distinct "fingerprint <hex>" in a program's output.
inline std::set<std::string> fingerprints_in(const std::string& output) {
  std::set<std::string> out;
  const std::regex fp(
      "(?:^|[^(])fingerprint ([0-9a-f]{16})");  // not "(fingerprint ...)" of a resume
  for (auto it = std::sregex_iterator(output.begin(), output.end(), fp);
       it != std::sregex_iterator(); ++it) {
    out.insert((*it)[1]);
  }
  return out;
}

/// The training loss of every step record in a metrics file, in order.
inline std::vector<double> step_losses(const std::string& metrics_path) {
  std::vector<double> out;
  std::ifstream in(metrics_path);
  std::string line;
  const std::regex loss(R"("event":"step".*"loss":([-0-9.e+]+))");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, loss)) out.push_back(std::stod(m[1]));
  }
  return out;
}

/// How many times `pattern` matches in `text`.
inline long count_matches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator());
}

}  // namespace vflow::testing
