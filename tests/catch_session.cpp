// Catch2's implementation, compiled once for every test program; each has a main of its own
// that calls run_catch (tests/main.cpp, tests/scheduler/main.cpp, tests/cuda/main.cpp).
#define CATCH_CONFIG_RUNNER
#include "catch_session.h"

#include <catch2/catch.hpp>

int vflow::testing::run_catch(int argc, char** argv) { return Catch::Session().run(argc, argv); }
