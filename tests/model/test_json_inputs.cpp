// The JSON inputs of a checkpoint (config.json, model.safetensors.index.json) go through the one
// JSON reader (core/json.hpp): a config.json that is not valid JSON is refused naming the file and
// the position, even where YAML (which read config.json before) would have taken it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/error_of.hpp"
#include "common/temp_dir.hpp"
#include "model/config.hpp"

using namespace mtplab;
using namespace mtplab::model;

namespace {
std::string tiny_config() {
  const std::string d = presets_dir();
  std::ifstream in(d.substr(0, d.size() - std::string("/configs").size()) +
                   "/tests/data/hf/glm5_next-tiny/config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TEST(JsonInputs, HfConfigThatIsNotJsonIsRefusedWithFileAndPosition) {
  const std::string good = tiny_config();
  ASSERT_FALSE(good.empty());
  test::TempDir tmp("mtplab-json-inputs");
  const std::string path = tmp / "config.json";
  std::ofstream(path) << good;
  EXPECT_NO_THROW(load_hf_config(path));

  const size_t close = good.rfind('}');
  struct Case {
    std::string text;
    const char* what;
  };
  const Case cases[] = {
      {good.substr(0, close) + ",\n}\n", "a trailing comma before '}'"},
      {"// exported\n" + good, "a comment (JSON has none)"},
      {good.substr(0, close / 2), "(truncated?)"},
      {good.substr(0, close) + ",\n  \"model_type\": \"glm5_next\"\n}\n",
       "model_type: duplicate key \"model_type\""},
      {"{model_type: glm5_next}", "expected a key in double quotes"},
  };
  for (const Case& c : cases) {
    std::ofstream(path, std::ios::trunc) << c.text;
    const std::string msg = test::error_of([&] { load_hf_config(path); });
    EXPECT_NE(msg.find(path + ":"), std::string::npos) << msg;
    EXPECT_NE(msg.find(": invalid JSON at byte "), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.what), std::string::npos) << msg;
  }
}
