// The scheduler test programs' entry point.
#include "catch_session.h"

int main(int argc, char** argv) { return vflow::testing::run_catch(argc, argv); }
