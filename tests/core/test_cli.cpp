// core/cli: the command-line reader of the mtplab sub-commands and the benchmarks. Every
// refusal is checked by the option and value its message must name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error_of.hpp"
#include "core/cli.hpp"
#include "core/error.hpp"

using namespace mtplab;
using namespace mtplab::cli;
using mtplab::test::error_of;

namespace {

Parser demo() {
  Parser p("prog run", "prog run EXP.yaml [options]");
  p.about("Runs things.\n")
      .integer("point", "i", "run only point i", 0, 1000)
      .repeatable_text("set", "key=value", "override a key; may be repeated")
      .text("out", "FILE", "results file")
      .flag("force", "replace the output")
      .number("max-gb", "G", "largest file", 0, 1e6)
      .integer_list("k", "1,4", "draft lengths", 1, 16)
      .choice("backend", {"auto", "cpu", "cuda"}, "where it runs\n(second line)")
      .choice_list("heads", {"bf16", "fp8"}, "head variants")
      .positionals("one experiment file", 1, 1)
      .epilogue("More text.");
  return p;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Cli, ReadsEveryKindWithBothSpellings) {
  const Args a =
      demo().parse({"exp.yaml", "--point", "3", "--set", "a=1", "--set=b=2", "--out=r.h5", "--force",
                    "--max-gb", "1.5", "--k", "1,2,4", "--backend=cuda", "--heads", "fp8"});
  EXPECT_FALSE(a.help());
  EXPECT_EQ(a.positional(), std::vector<std::string>{"exp.yaml"});
  EXPECT_EQ(a.integer("point", -1), 3);
  EXPECT_EQ(a.texts("set"), (std::vector<std::string>{"a=1", "b=2"}));
  EXPECT_EQ(a.text("out"), "r.h5");
  EXPECT_TRUE(a.flag("force"));
  EXPECT_EQ(a.number("max-gb", 0), 1.5);
  EXPECT_EQ(a.integers("k", {}), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(a.choice("backend", "auto"), "cuda");
  EXPECT_EQ(a.choices("heads", {}), std::vector<std::string>{"fp8"});
}

TEST(Cli, FallbacksWhenAbsent) {
  const Args a = demo().parse({"exp.yaml"});
  EXPECT_EQ(a.integer("point", -1), -1);
  EXPECT_TRUE(a.texts("set").empty());
  EXPECT_EQ(a.text("out", "default.h5"), "default.h5");
  EXPECT_FALSE(a.flag("force"));
  EXPECT_FALSE(a.has("out"));
  EXPECT_EQ(a.integers("k", {1, 4}), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(a.choices("heads", {"bf16", "fp8"}), (std::vector<std::string>{"bf16", "fp8"}));
}

TEST(Cli, UnknownOptionIsNamedWithASuggestion) {
  std::string m = error_of([] { demo().parse({"exp.yaml", "--pont", "3"}); });
  EXPECT_TRUE(has(m, "prog run: unknown option \"--pont\", did you mean --point?")) << m;
  EXPECT_TRUE(has(m, "(see prog run --help)")) << m;
  m = error_of([] { demo().parse({"exp.yaml", "--zzzzzz=1"}); });
  EXPECT_TRUE(has(m, "unknown option \"--zzzzzz\"")) << m;
  EXPECT_FALSE(has(m, "did you mean")) << m;
  m = error_of([] { demo().parse({"exp.yaml", "-x"}); });
  EXPECT_TRUE(has(m, "unknown option \"-x\"")) << m;
}

TEST(Cli, RepeatsAreRefusedUnlessDeclared) {
  std::string m = error_of([] { demo().parse({"exp.yaml", "--out", "a.h5", "--out=b.h5"}); });
  EXPECT_TRUE(has(m, "prog run: --out is given more than once")) << m;
  m = error_of([] { demo().parse({"exp.yaml", "--force", "--force"}); });
  EXPECT_TRUE(has(m, "--force is given more than once")) << m;
  EXPECT_NO_THROW(demo().parse({"exp.yaml", "--set", "a=1", "--set", "a=2"}));
}

TEST(Cli, ValuesAreChecked) {
  auto msg = [](std::vector<std::string> args) {
    args.insert(args.begin(), "exp.yaml");
    return error_of([&] { demo().parse(args); });
  };
  EXPECT_TRUE(has(msg({"--point", "x"}), "--point expects an integer, got \"x\""));
  EXPECT_TRUE(has(msg({"--point", "3x"}), "--point expects an integer, got \"3x\""));
  EXPECT_TRUE(has(msg({"--point", "1001"}), "--point 1001 is out of range [0, 1000]"));
  EXPECT_TRUE(has(msg({"--point", "-1"}), "--point -1 is out of range [0, 1000]"));
  EXPECT_TRUE(has(msg({"--point"}), "--point needs a value (i)"));
  EXPECT_TRUE(has(msg({"--max-gb", "big"}), "--max-gb expects a number, got \"big\""));
  EXPECT_TRUE(has(msg({"--max-gb", "-1"}), "--max-gb -1 is out of range"));
  EXPECT_TRUE(has(msg({"--k", "1,,4"}), "--k expects a comma list of integers (e.g. 1,2,4), got \"1,,4\""));
  EXPECT_TRUE(has(msg({"--k", "1,17"}), "--k 17 is out of range [1, 16]"));
  EXPECT_TRUE(has(msg({"--backend", "tpu"}), "--backend \"tpu\" is not one of auto, cpu, cuda"));
  EXPECT_TRUE(
      has(msg({"--heads", "bf16,fp4"}), "--heads \"fp4\" is not one of bf16, fp8 (a comma list of them)"));
  EXPECT_TRUE(has(msg({"--force=yes"}), "--force takes no value"));
}

TEST(Cli, PositionalCount) {
  std::string m = error_of([] { demo().parse({}); });
  EXPECT_TRUE(has(m, "prog run: expected one experiment file, got 0 argument(s)")) << m;
  m = error_of([] { demo().parse({"a.yaml", "b.yaml"}); });
  EXPECT_TRUE(has(m, "expected one experiment file, got 2 arguments: \"a.yaml\", \"b.yaml\"")) << m;
  // `--` ends the options: what follows is positional even when it starts with '-'.
  EXPECT_EQ(demo().parse({"--", "-odd.yaml"}).positional(), std::vector<std::string>{"-odd.yaml"});
  // Without a positionals() declaration none is accepted.
  Parser bare("tool", "tool [--x N]");
  bare.integer("x", "N", "a number", 0, 9);
  m = error_of([&] { bare.parse({"stray"}); });
  EXPECT_TRUE(has(m, "tool: unexpected argument \"stray\"")) << m;
}

TEST(Cli, HelpWinsOverEverythingElse) {
  EXPECT_TRUE(demo().parse({"--pont", "-h"}).help());
  EXPECT_TRUE(demo().parse({"--help"}).help());
  // After `--` it is an argument like any other.
  EXPECT_FALSE(demo().parse({"--", "--help"}).help());
}

TEST(Cli, HelpTextListsEveryOptionAligned) {
  const std::string h = demo().help();
  EXPECT_EQ(h.rfind("usage: prog run EXP.yaml [options]\n\nRuns things.\n", 0), 0u) << h;
  // The widest left column is "--backend auto|cpu|cuda" (23 characters): help starts at 2 + 23 + 2.
  EXPECT_TRUE(
      has(h, "\n  --backend auto|cpu|cuda  where it runs\n                           (second line)\n"))
      << h;
  EXPECT_TRUE(has(h, "\n  --point i                run only point i\n")) << h;
  EXPECT_TRUE(has(h, "\n  --force                  replace the output\n")) << h;
  EXPECT_TRUE(has(h, "\n  --heads bf16,fp8         head variants\n")) << h;
  EXPECT_EQ(h.substr(h.size() - 11), "More text.\n") << h;
}

TEST(Cli, ReadingAnUndeclaredOrMistypedOptionIsAProgrammingError) {
  const Args a = demo().parse({"exp.yaml"});
  EXPECT_TRUE(has(error_of([&] { (void)a.integer("nope", 0); }), "--nope was never declared"));
  EXPECT_TRUE(
      has(error_of([&] { (void)a.text("point"); }), "--point is declared as an integer, not read as a text"));
  EXPECT_THROW(Parser("p", "p").flag("help", "x"), Error);  // reserved
  EXPECT_THROW(Parser("p", "p").flag("a", "x").flag("a", "y"), Error);
}
