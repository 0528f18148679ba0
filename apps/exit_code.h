// How vflow's smaller command-line programs end on an error: a bad input (a job spec,
// a flag, a profile) exits 2, anything else 1, with the message on stderr.
#pragma once

#include <exception>
#include <iostream>

#include "vflow/core/error.h"

namespace vflow::apps {

template <typename Body>
int run_reporting_errors(Body&& body) {
  try {
    return body();
  } catch (const SpecError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace vflow::apps
