#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#ifdef VFLOW_SCHED_BINARY
namespace {

int run(const std::string& args, std::string* err = nullptr) {
  const std::string log = "sched_app_test.err";
  const int status =
      std::system((std::string(VFLOW_SCHED_BINARY) + " " + args + " >/dev/null 2>" + log).c_str());
  if (err != nullptr) {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    *err = text.str();
  }
  std::remove(log.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("vflow-sched maps bad flags to exit code 2 and a bad trace to 3", "[unit][scheduler]") {
  CHECK(run("simulate --jobs 5 --devices 4 --policy all") == 0);
  CHECK(run("simulate --rate fast") == 2);
  CHECK(run("simulate --policy round-robin") == 2);
  CHECK(run("simulate --bogus") == 2);
  {
    std::ofstream out("sched_app_test.tsv");
    out << "m\t100\t1\t1\t0\nm\t100\tmany\t1\t5\n";
  }
  std::string err;
  CHECK(run("simulate --trace sched_app_test.tsv --devices 4", &err) == 3);  // bad data
  CHECK_THAT(err, Catch::Matchers::Contains("sched_app_test.tsv:2: field 3 (scale_factor)"));
  CHECK(run("simulate --trace /dev/zero --devices 4", &err) == 3);
  CHECK_THAT(err,
             Catch::Matchers::Contains("/dev/zero: cannot read the trace: is a character device"));
  CHECK(run("simulate --measure 1:x") == 2);
  CHECK(run("simulate --jobs 0") == 2);
  std::remove("sched_app_test.tsv");
}
#endif
