// The experiments the harness tests parse and run: YAML on the tiny preset, written once.
#pragma once
#include <string>

namespace mtplab::test {

/// An experiment on the tiny preset (128 rows of context) with synthetic weights (seed 3) and a
/// synthetic trace: `trace` holds the keys of `trace.synthetic` (inside its braces), `rest` the
/// top-level keys that follow.
inline std::string tiny_experiment(const std::string& trace, const std::string& rest) {
  return "model:\n  preset: tiny\n  max_seq_len: 128\nweights: {synthetic: {seed: 3}}\ntrace:\n  synthetic: "
         "{" +
         trace + "}\n" + rest;
}

}  // namespace mtplab::test
