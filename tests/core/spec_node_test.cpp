#include "vflow/core/spec_node.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <functional>

#include "support.h"
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

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const SpecError& e) {
    return e.what();
  }
  return "";
}
std::string parse_error(const std::string& text) {
  return error_of([&] { vflow::parse_yaml(text, "h.yaml"); });
}
}  // namespace

TEST_CASE("hostile YAML is refused with a located message, never a crash", "[unit]") {
  // An alias that contains itself: yaml-cpp builds a cyclic node graph.
  CHECK_THAT(parse_error("model: &a [*a]\n"),
             Contains("h.yaml:1:") && Contains("nested more than 64 levels"));
  CHECK_THAT(parse_error("a: &x {b: *x}\n"), Contains("nested more than 64 levels"));
  // Deep nesting, as flow and as block collections.
  CHECK_THAT(parse_error(std::string(100, '[') + std::string(100, ']')),
             Contains("h.yaml:1:66: ") && Contains("nested more than 64 levels"));
  CHECK_THAT(parse_error(std::string(5000, '[') + std::string(5000, ']')),
             Contains("h.yaml: nested more than"));
  std::string block;
  for (int i = 0; i < 100; ++i) block += std::string(static_cast<size_t>(i), ' ') + "k:\n";
  CHECK_THAT(parse_error(block), Contains("h.yaml:66:") && Contains("nested more than"));
  // Aliases that repeat one another: 10^7 values from a few lines.
  std::string bomb = "a: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 8; ++i) {
    bomb += fmt::format(
        "b{0}: &a{0} [*a{1}, *a{1}, *a{1}, *a{1}, *a{1}, *a{1}, *a{1}, *a{1}, "
        "*a{1}, *a{1}]\n",
        i, i - 1);
  }
  CHECK_THAT(parse_error(bomb), Contains("h.yaml:") && Contains("more than 200000 values"));
  // Plain anchors and aliases are fine.
  const SpecNode ok = vflow::parse_yaml("a: &x {b: 1}\nc: *x\n", "h.yaml");
  CHECK(ok.find("c")->find("b")->value() == "1");
  CHECK(ok.find("c")->find("b")->path() == "c.b");
  // Huge values and keys.
  CHECK_THAT(parse_error("a: " + std::string((1 << 20) + 1, 'x') + "\n"),
             Contains("h.yaml:1:4: a: a value of 1048577 bytes"));
  CHECK_THAT(parse_error("? " + std::string(2000, 'k') + "\n: 1\n"),
             Contains("a key of 2000 bytes"));
  // Bytes that are not UTF-8 text, or control characters.
  CHECK_THAT(parse_error(std::string("a: 1\nb: \xff\xfe\n")),
             Contains("h.yaml:2:4: byte 0xff is not allowed"));
  CHECK_THAT(parse_error(std::string("a: x\0y\n", 7)), Contains("h.yaml:1:5: byte 0x00"));
  CHECK_THAT(parse_error("a: \x1b[31m\n"), Contains("h.yaml:1:4: byte 0x1b"));
  CHECK_THAT(parse_error("a: \xc0\xaf\n"), Contains("byte 0xc0"));       // overlong '/'
  CHECK(parse_error("name: \xc3\xa9t\xc3\xa9 \xe2\x9c\x93\n").empty());  // real UTF-8 is text
  CHECK(vflow::parse_yaml("", "h.yaml").is_null());
}

TEST_CASE("YAML files: empty documents and paths that are not regular files", "[unit]") {
  vflow::testing::TempDir dir;
  const auto load_error = [](const std::string& path) {
    return error_of([&] { vflow::load_yaml_file(path, "job spec"); });
  };
  vflow::testing::write_file(dir.file("empty.yaml"), "");
  CHECK(load_error(dir.file("empty.yaml")) ==
        dir.file("empty.yaml") + ": the job spec is empty (no YAML document)");
  vflow::testing::write_file(dir.file("comment.yaml"), "# nothing\n");
  CHECK_THAT(load_error(dir.file("comment.yaml")), Contains("is empty"));
  CHECK_THAT(load_error(dir.path()), Contains(": cannot read the job spec: is a directory"));
  CHECK_THAT(load_error("/dev/zero"),
             Contains("/dev/zero: cannot read the job spec: is a character device"));
  REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);
  CHECK_THAT(load_error(dir.file("fifo")), Contains("is a FIFO"));  // without blocking
  CHECK_THAT(load_error(dir.file("missing.yaml")), Contains("cannot open: No such file"));
}

TEST_CASE("override values get the same bounds and name the override", "[unit]") {
  SpecNode root = vflow::parse_yaml("a: {b: 1}\n", "o.yaml");
  const auto set_error = [&](const std::string& assignment) {
    return error_of([&] { vflow::apply_override(root, assignment); });
  };
  CHECK_THAT(set_error("a.b=&x [*x]"),
             Contains("--set a.b=&x [*x]: cannot parse the value: a.b[0][0]") &&
                 Contains("nested more than 64 levels"));
  CHECK_THAT(set_error("a.b=[1, 2"), Contains("--set a.b=[1, 2: cannot parse the value:"));
  CHECK_THAT(set_error(std::string("a.b=\x01\xff")),
             Contains("--set a.b=\\x01\\xff: cannot parse the value: byte 0x01"));
  CHECK_THAT(set_error("a.b=" + std::string(500, '{')), Contains("cannot parse the value"));
  // "key=" unsets the key (documented), it is not an error.
  CHECK(set_error("a.b=").empty());
  CHECK(root.find("a")->find("b")->is_null());
}

TEST_CASE("YAML that is small as text but huge as a tree is refused quickly", "[unit]") {
  // One 1 MiB value repeated through aliases: 10^4 copies.
  std::string copies = "s: &s \"" + std::string(1 << 20, 'x') + "\"\n";
  copies += "l1: &l1 [*s, *s, *s, *s, *s, *s, *s, *s, *s, *s]\n";
  for (int i = 2; i <= 4; ++i) {
    copies += fmt::format(
        "l{0}: &l{0} [*l{1}, *l{1}, *l{1}, *l{1}, *l{1}, *l{1}, *l{1}, *l{1}, "
        "*l{1}, *l{1}]\n",
        i, i - 1);
  }
  CHECK_THAT(parse_error(copies), Contains("more than 64 MiB of values and keys"));
  // Long keys nested deep: every value below them holds the whole dotted path.
  std::string deep;
  for (int i = 0; i < 60; ++i) {
    deep += std::string(static_cast<size_t>(i), ' ') + std::string(1000, 'k') + std::to_string(i) +
            ":\n";
  }
  deep += std::string(60, ' ') + "v: [1";
  for (int i = 0; i < 20000; ++i) deep += ", 1";
  deep += "]\n";
  CHECK_THAT(parse_error(deep), Contains("more than 64 MiB of values and keys"));
  // Many distinct keys parse in linear time (no search per key).
  std::string flat;
  for (int i = 0; i < 50000; ++i) flat += fmt::format("key{}: {}\n", i, i);
  const SpecNode many = vflow::parse_yaml(flat, "h.yaml");
  CHECK(many.entries().size() == 50000);
  CHECK(many.find("key49999")->value() == "49999");
  // Escapes cannot bring in control characters either.
  CHECK_THAT(parse_error("a: \"x\\0y\"\n"), Contains("h.yaml:1:4: a: the value holds the control "
                                                     "character 0x00"));
  CHECK_THAT(parse_error("\"k\\e\": 1\n"), Contains("a key holds the control character 0x1b"));
}

TEST_CASE("errors about an absent section's defaults still name where it would be", "[unit]") {
  const SpecNode root = vflow::parse_yaml("semantic: {seed: 1}\n", "d.yaml");
  OptionReader top(root);
  const SpecNode& semantic = top.section("semantic");
  OptionReader r(semantic);
  const SpecNode& model = r.section("model");  // absent
  CHECK(model.is_null());
  CHECK(model.path() == "semantic.model");
  OptionReader m(model);
  CHECK_THROWS_WITH(m.fail("layers", "needs token sequences"),
                    Contains("d.yaml:1:11: semantic.model.layers: needs token sequences"));
}
