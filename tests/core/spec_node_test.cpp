#include "vflow/core/spec_node.h"

#include <catch2/catch.hpp>

#include "vflow/core/error.h"

using Catch::Matchers::Contains;
using vflow::OptionReader;
using vflow::SpecError;
using vflow::SpecNode;

TEST_CASE("parse_yaml keeps file, line and key path of every value", "[unit]") {
  const SpecNode root = vflow::parse_yaml("a:\n  b: 3\n  c: [1, 2]\n", "x.yaml");
  const SpecNode* b = root.find("a")->find("b");
  REQUIRE(b != nullptr);
  CHECK(b->value() == "3");
  CHECK(b->path() == "a.b");
  CHECK(b->where().str() == "x.yaml:2:6");
  CHECK(root.find("a")->find("c")->items().size() == 2);
}

TEST_CASE("OptionReader reads typed values with ranges", "[unit]") {
  const SpecNode root =
      vflow::parse_yaml("n: 5\nx: 0.5\nflag: yes\nlist: [1, 2]\nname: sgd\n", "r.yaml");
  OptionReader r(root);
  CHECK(r.get_int("n", 0, 0, 10) == 5);
  CHECK(r.get_double("x", 0, 0, 1) == 0.5);
  CHECK(r.get_bool("flag", false));
  CHECK(r.get_int_list("list", {}, 0, 5) == std::vector<int64_t>{1, 2});
  CHECK(r.get_choice("name", "", {"sgd", "adamw"}) == "sgd");
  CHECK(r.get_int("absent", 7, 0, 10) == 7);
  CHECK_NOTHROW(r.finish());
}

TEST_CASE("OptionReader errors name the location, the key and the problem", "[unit]") {
  const SpecNode root = vflow::parse_yaml("n: five\nm: 11\nk: 1\nname: sdg\n", "e.yaml");
  OptionReader r(root);
  CHECK_THROWS_WITH(r.get_int("n", 0, 0, 10),
                    Contains("e.yaml:1:4: n: expected an integer, got 'five'"));
  CHECK_THROWS_WITH(r.get_int("m", 0, 0, 10),
                    Contains("e.yaml:2:4: m: value 11 is out of range [0, 10]"));
  CHECK_THROWS_WITH(r.get_choice("name", "", {"sgd", "adamw"}),
                    Contains("e.yaml:4:7: name: unknown value 'sdg'; choices: sgd, adamw"));
  CHECK_THROWS_WITH(r.finish(), Contains("e.yaml:3:1: k: unknown key"));
}

TEST_CASE("YAML syntax errors and duplicate keys name file and line", "[unit]") {
  CHECK_THROWS_WITH(vflow::parse_yaml("a: [1, 2\nb: 3\n", "s.yaml"), Contains("s.yaml:"));
  CHECK_THROWS_WITH(vflow::parse_yaml("a: 1\na: 2\n", "d.yaml"),
                    Contains("d.yaml:2:1: a: duplicate key"));
}

TEST_CASE("overrides replace or create keys and carry their own location", "[unit]") {
  SpecNode root = vflow::parse_yaml("a:\n  b: 1\n", "o.yaml");
  vflow::apply_override(root, "a.b=2");
  vflow::apply_override(root, "a.c.d=[3, 4]");
  CHECK(root.find("a")->find("b")->value() == "2");
  CHECK(root.find("a")->find("c")->find("d")->items().size() == 2);
  CHECK(root.find("a")->find("b")->describe() == "--set a.b=2: a.b");
  CHECK_THROWS_AS(vflow::apply_override(root, "novalue"), SpecError);
  CHECK_THROWS_AS(vflow::apply_override(root, "a.b.x=1"), SpecError);
}
