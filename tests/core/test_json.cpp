// The one JSON reader (core/json.hpp): RFC 8259 and nothing more. What JSON refuses is an error
// naming the file, line, column and byte; what JSON allows reads back.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error_of.hpp"
#include "core/json.hpp"

using namespace mtplab;

namespace {
using mtplab::test::error_of;

std::string refused(const std::string& text) {
  return error_of([&] { json::parse(text, "config.json"); });
}
}  // namespace

TEST(Json, RefusesWhatJsonRefusesNamingFileAndPosition) {
  struct Case {
    const char* text;
    const char* where;  ///< "file:line:col"
    const char* what;
  };
  const Case cases[] = {
      {"{\n  \"a\": 1,\n}", "config.json:3:1:", "a trailing comma before '}'"},
      {"[1, 2,]", "config.json:1:7:", "a trailing comma before ']'"},
      {"{\n  // a note\n  \"a\": 1\n}", "config.json:2:3:", "a comment (JSON has none)"},
      {"{\"a\": 1 /* c */}", "config.json:1:9:", "a comment (JSON has none)"},
      {"{a: 1}", "config.json:1:2:", "expected a key in double quotes"},
      {"{'a': 1}", "config.json:1:2:", "a single quote"},
      {"{\"a\": [1, 2", "config.json:1:12:", "the end of the text (truncated?)"},
      {"{\"a\": \"tru", "config.json:1:11:", "the text ends inside a string (truncated?)"},
      {"", "config.json:1:1:", "expected a value, found the end of the text"},
      {"{\"a\": 1,\n \"a\": 2}",
       "config.json:2:2:", "a: duplicate key \"a\" (it appears twice in one object)"},
      {"{\"a\": NaN}", "config.json:1:7:", "expected a value"},
      {"{\"a\": 01}", "config.json:1:8:", "expected ',' or '}'"},
      {"{\"a\": 1} x", "config.json:1:10:", "text after the document"},
      {"{\"a\": yes}", "config.json:1:7:", "expected a value"},
  };
  for (const Case& c : cases) {
    const std::string msg = refused(c.text);
    EXPECT_NE(msg.find(c.where), std::string::npos) << c.text << " -> " << msg;
    EXPECT_NE(msg.find("invalid JSON at byte"), std::string::npos) << c.text << " -> " << msg;
    EXPECT_NE(msg.find(c.what), std::string::npos) << c.text << " -> " << msg;
  }
}

TEST(Json, ReadsWhatJsonAllows) {
  const json::Value v = json::parse(
      "{\"a\": [1, -2.5e3, true, false, null], \"b\": {\"c\": \"x\\u00e9\\n\"}, \"\": {}}", "t.json");
  ASSERT_EQ(v.kind, json::Value::Kind::object);
  ASSERT_EQ(v.members.size(), 3u);
  EXPECT_EQ(v.members[0].second.items.at(1).text, "-2.5e3");
  EXPECT_EQ(v.members[1].second.members.at(0).second.text, "x\xc3\xa9\n");
  EXPECT_EQ(v.members[1].second.line, 1);
}

TEST(Json, LoadAsYamlRefusesInvalidJsonThatYamlWouldRead) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "mtplab-json-test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  std::ofstream(path) << "{\n  \"model_type\": \"glm5_next\",\n  hidden_size: 128,\n}\n";  // YAML reads it
  const std::string msg = error_of([&] { json::load_as_yaml(path); });
  EXPECT_NE(msg.find(path + ":3:3: invalid JSON"), std::string::npos) << msg;
  std::ofstream(path) << "{\n  \"model_type\": \"glm5_next\",\n  \"hidden_size\": 128\n}\n";
  const YamlNode n = json::load_as_yaml(path);
  MapReader m(n);
  EXPECT_EQ(m.req_int("hidden_size", 1, 1 << 20), 128);
  EXPECT_NE(m.req("hidden_size").where().find(path + ":3:"), std::string::npos);
  std::filesystem::remove_all(dir);
}
