// vflow_fuzz_replay TARGET PATH...: runs every file under the PATHs (the committed seeds
// and regression inputs) through one fuzz target of the normal build. A finding aborts;
// the test fails. An input named accept-* must be accepted, one named refuse-* or
// regression-* refused. Prints what happened to each input.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_target.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TARGET CORPUS_DIR_OR_FILE...\ntargets:", argv[0]);
    for (const auto& t : vflow::fuzz::targets()) std::fprintf(stderr, " %s", t.name);
    std::fprintf(stderr, "\n");
    return 2;
  }
  const auto* target = vflow::fuzz::find_target(argv[1]);
  if (!target) {
    std::fprintf(stderr, "no fuzz target '%s'\n", argv[1]);
    return 2;
  }
  std::vector<std::string> inputs;
  for (int i = 2; i < argc; ++i) {
    if (fs::is_directory(argv[i])) {
      for (const auto& entry : fs::recursive_directory_iterator(argv[i])) {
        if (entry.is_regular_file()) inputs.push_back(entry.path().string());
      }
    } else if (fs::is_regular_file(argv[i])) {
      inputs.emplace_back(argv[i]);
    } else {
      std::fprintf(stderr, "%s: no such corpus\n", argv[i]);
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs for %s: a corpus that replays nothing checks nothing\n",
                 target->name);
    return 2;
  }
  std::sort(inputs.begin(), inputs.end());
  int wrong = 0;
  for (const auto& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string refusal =
        target->run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    std::printf("%s: %s (%zu bytes): %s\n", target->name, path.c_str(), bytes.size(),
                refusal.empty() ? "accepted" : ("refused: " + refusal).c_str());
    // A committed input says by its name what must happen to it.
    const std::string name = fs::path(path).filename().string();
    const bool must_accept = name.rfind("accept-", 0) == 0;
    const bool must_refuse = name.rfind("refuse-", 0) == 0 || name.rfind("regression-", 0) == 0;
    if ((must_accept && !refusal.empty()) || (must_refuse && refusal.empty())) {
      std::fprintf(stderr, "%s: %s must be %s\n", target->name, path.c_str(),
                   must_accept ? "accepted" : "refused");
      ++wrong;
    }
  }
  if (wrong > 0) {
    std::fprintf(stderr, "%s: %d input(s) not treated as their names say\n", target->name, wrong);
    return 1;
  }
  std::printf("%s: replayed %zu inputs, no finding\n", target->name, inputs.size());
  return 0;
}
