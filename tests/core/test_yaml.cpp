// Strict YAML helpers: every error names the file, key path, line and column; the text scan
// (unclosed quotes, second documents), quoted numbers, and the key a misspelling meant.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

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

TEST(Yaml, MissingKeyNamesTheMapping) {  // (a nested mapping: its own position)
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
  EXPECT_NE(error_of([&] {
              m.req_int("b", 0, 65535);
            }).find("t.yaml:2:4: b: value 70000 is out of range [0, 65535]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m.req_bool("c"); }).find("c: expected true/false"), std::string::npos);
  EXPECT_NE(error_of([&] { m.req_string("d"); }).find("d: expected a string, got a sequence"),
            std::string::npos);
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

// ---- what plain YAML lets through and mtplab does not ---------------------------------------------

TEST(Yaml, UnclosedQuoteIsReportedAtTheQuote) {
  // yaml-cpp reads an unclosed quote to the end of the file (the keys after it vanish into the
  // value) or fails at a later place; the scan names the quote itself.
  std::string msg = error_of([] {
    YamlNode::load_string("model: tiny\noutput: \"results/x.h5\ntrace: {synthetic: {}}\n", "exp.yaml");
  });
  EXPECT_NE(msg.find("exp.yaml:2:9: unclosed quote"), std::string::npos) << msg;
  msg = error_of([] {
    YamlNode::load_string("model: tiny\noutput: \"x.h5\ntrace: {synthetic: {}}\nbackend: \"cpu\"\n",
                          "exp.yaml");
  });
  EXPECT_NE(msg.find("exp.yaml:2:9: unclosed quote"), std::string::npos) << msg;
  msg = error_of([] { YamlNode::load_string("a: 1\nb: [x, 'y, z]\n", "q.yaml"); });
  EXPECT_NE(msg.find("q.yaml:2:8: unclosed quote"), std::string::npos) << msg;
  msg = error_of([] { YamlNode::load_string("items:\n  - \"first\n  - second\n", "q.yaml"); });
  EXPECT_NE(msg.find("q.yaml:2:5: unclosed quote"), std::string::npos) << msg;
}

TEST(Yaml, QuotesThatOpenNothingAreFine) {
  // A quote inside a plain value, in a comment or in a block scalar is an ordinary character;
  // escaped quotes do not close a value; JSON's style is YAML's flow style.
  const std::string text =
      "name: it's plain\n"
      "note: say \"hi  # a comment ends a plain value\n"
      "c: 1  # it's a comment\n"
      "d: \"a \\\" b\"\n"
      "e: 'it''s'\n"
      "text: |\n"
      "  \"open\n"
      "  it's\n"
      "f: {\"k\":\"v\", 'l': [\"x\", y]}\n"
      "g: !!str \"3\"\n";
  auto doc = YamlNode::load_string(text, "ok.yaml");
  MapReader m(doc);
  EXPECT_EQ(m.req_string("name"), "it's plain");
  EXPECT_EQ(m.req_string("note"), "say \"hi");
  EXPECT_EQ(m.req_int("c", 0, 9), 1);
  EXPECT_EQ(m.req_string("d"), "a \" b");
  EXPECT_EQ(m.req_string("e"), "it's");
  EXPECT_EQ(m.req_string("text"), "\"open\nit's\n");
  EXPECT_EQ(m.req("f").entries().size(), 2u);
  EXPECT_EQ(m.req_string("g"), "3");
  m.finish();
}

TEST(Yaml, EveryShippedYamlFileScansClean) {
  // The scan is stricter than YAML; it must not refuse any file the repository ships.
  const char* src = std::getenv("MTPLAB_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "MTPLAB_SOURCE_DIR is not set";
  int files = 0;
  for (const char* dir : {"configs", "experiments", "data", "tests"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(std::string(src) + "/" + dir)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".yaml" && ext != ".yml" && ext != ".json")) continue;
      std::ifstream in(entry.path());
      std::stringstream ss;
      ss << in.rdbuf();
      const auto issue = scan_yaml_text(ss.str());
      EXPECT_FALSE(issue) << entry.path() << ":" << issue->line << ":" << issue->column << ": "
                          << issue->message;
      ++files;
    }
  }
  EXPECT_GE(files, 10);
}

TEST(Yaml, SecondDocumentIsAnErrorAtItsLine) {
  std::string msg =
      error_of([] { YamlNode::load_string("model: tiny\n# next\n---\nmodel: small\n", "two.yaml"); });
  EXPECT_NE(msg.find("two.yaml:3:1: a second YAML document starts here (---)"), std::string::npos) << msg;
  // An empty second document counts too; `...` followed by content starts one as well.
  EXPECT_NE(error_of([] { YamlNode::load_string("a: 1\n---\n", "t.yaml"); }).find("t.yaml:2:1: a second"),
            std::string::npos);
  msg = error_of([] { YamlNode::load_string("a: 1\n...\nb: 2\n", "t.yaml"); });
  EXPECT_NE(msg.find("t.yaml:3:1: a second YAML document"), std::string::npos) << msg;
  // A marker before the only document, or a block scalar line that looks like one, is fine.
  auto doc = YamlNode::load_string("%YAML 1.2\n---\na: |\n  ---\n  x\nb: 2\n...\n", "one.yaml");
  MapReader m(doc);
  EXPECT_EQ(m.req_string("a"), "---\nx\n");
  EXPECT_EQ(m.req_int("b", 0, 9), 2);
}

TEST(Yaml, QuotedNumbersAreRefused) {
  auto doc = YamlNode::load_string("k: \"3\"\nx: '1.5'\nskip: \"head\"\nn: 3\n", "q.yaml");
  MapReader m(doc);
  std::string msg = error_of([&] { m.req_int("k", 1, 16); });
  EXPECT_NE(msg.find("q.yaml:1:4: k: expected an integer, got the quoted text \"3\""), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("write 3 without quotes"), std::string::npos) << msg;
  msg = error_of([&] { m.req_double("x", 0, 9); });
  EXPECT_NE(msg.find("x: expected a number, got the quoted text \"1.5\""), std::string::npos) << msg;
  // Text stays text: a quoted choice is read as the word it is.
  EXPECT_EQ(m.req_choice("skip", {"none", "head"}), "head");
  EXPECT_EQ(m.req_int("n", 1, 16), 3);
  EXPECT_TRUE(m.req("k").is_quoted());
  EXPECT_FALSE(m.req("n").is_quoted());
}

TEST(Yaml, MisspeltRequiredKeyIsReportedWhereItIs) {
  auto doc = YamlNode::load_string("model: tiny\nweights: {}\ntrce:\n  path: t.h5\n", "exp.yaml");
  MapReader top(doc);
  top.req("model");
  top.opt("weights");
  const std::string msg = error_of([&] { top.req("trace"); });
  EXPECT_NE(
      msg.find(
          "exp.yaml:3:1: trce: missing required key \"trace\" (did you mean \"trace\" instead of \"trce\"?)"),
      std::string::npos)
      << msg;
  // Nothing close: the top level is named by the file alone (its first key's line says nothing).
  auto other = YamlNode::load_string("model: tiny\noutput: o.h5\n", "exp.yaml");
  MapReader o(other);
  const std::string none = error_of([&] { o.req("trace"); });
  EXPECT_EQ(none, "exp.yaml: missing required key \"trace\" at the top level");
}

TEST(Yaml, SuggestKey) {
  const std::vector<std::string> keys = {"warmup_steps", "sequences", "max_steps", "repeats"};
  EXPECT_EQ(suggest_key("warmup_step", keys), "warmup_steps");
  EXPECT_EQ(suggest_key("sequnces", keys), "sequences");
  EXPECT_EQ(suggest_key("warmup", keys), "warmup_steps");  // a prefix of one key
  EXPECT_EQ(suggest_key("repeatss", keys), "repeats");
  EXPECT_EQ(suggest_key("steps", keys), "");  // far from every key
  EXPECT_EQ(suggest_key("ma", {"max_steps", "margin"}), "");
  EXPECT_EQ(suggest_key("m", keys), "");
  const std::vector<std::string> two = {"max_steps", "max_seq_len"};
  EXPECT_EQ(suggest_key("max_s", two), "");  // a prefix of both: no guess
}

// An empty value (nothing, ~, null) is an error at the key, through req and opt alike: YAML reads
// it as null, which took the key's default before (`max_steps: ~` ran 64 steps).
TEST(Yaml, EmptyValueIsAnErrorNamingFileLineAndKey) {
  for (const char* empty : {"", " ~", " null", " Null"}) {
    auto doc = YamlNode::load_string(std::string("measure:\n  warmup_steps: 2\n  max_steps:") + empty + "\n",
                                     "exp.yaml");
    MapReader top(doc);
    MapReader measure(top.req("measure"));
    EXPECT_EQ(measure.opt_int("warmup_steps", 0, 0, 100), 2);
    for (int required = 0; required < 2; ++required) {
      const std::string msg = error_of([&] {
        if (required)
          measure.req_int("max_steps", 0, 100);
        else
          measure.opt_int("max_steps", 64, 0, 100);
      });
      EXPECT_NE(msg.find("exp.yaml:3:3: measure.max_steps: the value is empty"), std::string::npos)
          << "[" << empty << "] " << msg;
    }
  }
  // An empty mapping is a value (every key at its default); only a null is refused.
  auto doc = YamlNode::load_string("measure: {}\nsweep:\n", "exp.yaml");
  MapReader top(doc);
  EXPECT_TRUE(top.opt("measure").has_value());
  EXPECT_NE(error_of([&] { top.opt("sweep"); }).find("exp.yaml:2:1: sweep: the value is empty"),
            std::string::npos);
}
