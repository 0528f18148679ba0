// The test programs' Catch2 session, whose implementation is compiled once
// (catch_session.cpp).
#pragma once

namespace vflow::testing {

/// Runs the test cases that the command line selects; returns the process's exit code.
int run_catch(int argc, char** argv);

}  // namespace vflow::testing
