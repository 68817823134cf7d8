// Strict YAML helpers: every error names the file, key path, line and column.
#include <gtest/gtest.h>

#include "common/error_of.hpp"
#include "core/yaml.hpp"

using namespace mtplab;

namespace {
using mtplab::test::error_of;
}  // namespace

TEST(Yaml, UnknownKeyNamesFileLineColumnAndSuggestion) {
  auto doc = YamlNode::load_string("model:\n  hidden: 128\n  vocba: 4096\n", "exp.yaml");
  MapReader top(doc);
  MapReader model(top.req("model"));
  model.req_int("hidden", 1, 1 << 20);
  model.opt_int("vocab", 0, 0, 1 << 30);
  const std::string msg = error_of([&] { model.finish(); });
  EXPECT_NE(msg.find("exp.yaml:3:3: model.vocba: unknown key \"vocba\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean \"vocab\""), std::string::npos) << msg;
}

TEST(Yaml, MissingKeyNamesTheMapping) {
  auto doc = YamlNode::load_string("model:\n  hidden: 128\n", "exp.yaml");
  MapReader top(doc);
  MapReader model(top.req("model"));
  const std::string msg = error_of([&] { model.req("vocab"); });
  EXPECT_NE(msg.find("exp.yaml:2:3: model: missing required key \"vocab\""), std::string::npos) << msg;
}

TEST(Yaml, WrongTypeAndRange) {
  auto doc = YamlNode::load_string("a: 12x\nb: 70000\nc: maybe\nd: [1, 2]\n", "t.yaml");
  MapReader m(doc);
  EXPECT_NE(error_of([&] { m.req_int("a", 0, 10); }).find("t.yaml:1:4: a: expected an integer, got \"12x\""),
            std::string::npos);
  EXPECT_NE(error_of([&] { m.req_int("b", 0, 65535); }).find("t.yaml:2:4: b: value 70000 is out of range [0, 65535]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m.req_bool("c"); }).find("c: expected true/false"), std::string::npos);
  EXPECT_NE(error_of([&] { m.req_string("d"); }).find("d: expected a string, got a sequence"), std::string::npos);
}

TEST(Yaml, ChoiceListsTheAlternatives) {
  auto doc = YamlNode::load_string("skip: heda\n", "t.yaml");
  MapReader m(doc);
  const std::string msg = error_of([&] { m.req_choice("skip", {"none", "head", "block"}); });
  EXPECT_NE(msg.find("\"heda\" is not one of {none, head, block}"), std::string::npos) << msg;
}

TEST(Yaml, SyntaxErrorHasLine) {
  const std::string msg = error_of([] { YamlNode::load_string("a: [1, 2\nb: 3\n", "bad.yaml"); });
  EXPECT_NE(msg.find("bad.yaml:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("YAML syntax error"), std::string::npos) << msg;
}

TEST(Yaml, DuplicateKeyIsAnError) {
  auto doc = YamlNode::load_string("a: 1\na: 2\n", "d.yaml");
  const std::string msg = error_of([&] { MapReader m(doc); });
  EXPECT_NE(msg.find("duplicate key"), std::string::npos) << msg;
}

TEST(Yaml, ValuesParse) {
  auto doc = YamlNode::load_string("i: 0x10\nd: 1e-5\nb: on\ns: hello\nl: [3, 4]\n", "v.yaml");
  MapReader m(doc);
  EXPECT_EQ(m.req_int("i", 0, 100), 16);
  EXPECT_DOUBLE_EQ(m.req_double("d", 0, 1), 1e-5);
  EXPECT_TRUE(m.req_bool("b"));
  EXPECT_EQ(m.req_string("s"), "hello");
  auto items = m.req("l").items();
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[1].as_int(), 4);
  EXPECT_EQ(items[1].path(), "l[1]");
  m.finish();
}

TEST(Yaml, MissingFileIsAnError) {
  const std::string msg = error_of([] { YamlNode::load_file("/nonexistent/x.yaml"); });
  EXPECT_NE(msg.find("/nonexistent/x.yaml: cannot open"), std::string::npos) << msg;
}
