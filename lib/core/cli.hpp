// The command-line reader of the mtplab binary's sub-commands and of the benchmarks.
//
// A Parser declares every option a program takes, with its kind (a flag, a text, an integer or
// a number in a range, a comma list of integers, one or a comma list of choices), its help line
// and whether it may be given more than once; parse() checks the whole command line against
// that, so a typo never runs with defaults:
// - `--name value` and `--name=value`; `-h` / `--help` anywhere asks for the help text;
//   arguments after `--` are positional;
// - an unknown option is an error naming it, with the declared option it most likely meant;
// - an option given twice is an error unless it was declared repeatable;
// - a value of the wrong kind or out of its range is an error naming the option and the value;
// - the number of positional arguments is checked against what was declared.
// Every error is an mtplab::Error whose message starts with the program's name
// ("mtplab run: ..."). run_main() turns errors into the usage line and exit status 2 for a
// program's main().
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace mtplab::cli {

enum class Kind { flag, text, integer, number, integer_list, choice, choice_list };

struct OptionSpec {
  std::string name;     ///< without the leading "--"
  std::string metavar;  ///< what the help shows after the name ("" for a flag)
  std::string help;     ///< may hold several lines; the later ones are indented in the help text
  Kind kind = Kind::text;
  bool repeatable = false;
  int64_t int_min = 0, int_max = 0;  ///< integer, integer_list
  double num_min = 0, num_max = 0;   ///< number
  std::vector<std::string> allowed;  ///< choice, choice_list
};

/// A parsed command line; every value in it was checked against its declaration. Asking for an
/// option that was not declared with the kind asked for is a programming error (an Error too).
class Args {
 public:
  bool help() const { return help_; }
  bool flag(const std::string& name) const;
  /// Whether the option was given (any kind).
  bool has(const std::string& name) const;
  std::string text(const std::string& name, const std::string& fallback = "") const;
  /// Every value of a repeatable text option, in command-line order.
  std::vector<std::string> texts(const std::string& name) const;
  int64_t integer(const std::string& name, int64_t fallback) const;
  double number(const std::string& name, double fallback) const;
  std::vector<int64_t> integers(const std::string& name, const std::vector<int64_t>& fallback) const;
  std::string choice(const std::string& name, const std::string& fallback) const;
  std::vector<std::string> choices(const std::string& name, const std::vector<std::string>& fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  friend class Parser;
  const OptionSpec& spec(const std::string& name, Kind kind) const;
  const std::string* last(const std::string& name) const;

  std::string program_;
  std::vector<OptionSpec> specs_;
  bool help_ = false;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

class Parser {
 public:
  /// `program` starts every message ("mtplab run"); `usage` is the usage line without "usage: ".
  Parser(std::string program, std::string usage);

  /// Text between the usage line and the options, and after the options, in the help.
  Parser& about(std::string text);
  Parser& epilogue(std::string text);

  Parser& flag(const std::string& name, const std::string& help);
  Parser& text(const std::string& name, const std::string& metavar, const std::string& help);
  /// A text option that may be given any number of times (Args::texts()).
  Parser& repeatable_text(const std::string& name, const std::string& metavar, const std::string& help);
  Parser& integer(const std::string& name, const std::string& metavar, const std::string& help, int64_t min,
                  int64_t max);
  Parser& number(const std::string& name, const std::string& metavar, const std::string& help, double min,
                 double max);
  /// "1,2,4": one or more integers, each in [min, max].
  Parser& integer_list(const std::string& name, const std::string& metavar, const std::string& help,
                       int64_t min, int64_t max);
  Parser& choice(const std::string& name, const std::vector<std::string>& allowed, const std::string& help);
  /// "a,b": one or more of `allowed`.
  Parser& choice_list(const std::string& name, const std::vector<std::string>& allowed,
                      const std::string& help);
  /// Between `min` and `max` positional arguments; `what` names them in messages ("one
  /// experiment file"). Without this call no positional argument is accepted.
  Parser& positionals(std::string what, size_t min, size_t max);

  /// Checks `args` (the arguments after the program / command name). When `-h` / `--help` is
  /// among them nothing else is checked and the result's help() is true.
  Args parse(const std::vector<std::string>& args) const;
  /// The help text: usage, about, one aligned line per option, epilogue.
  std::string help() const;
  const std::string& usage() const { return usage_; }
  const std::string& program() const { return program_; }

  /// For a program's main(): parses argv[1..] and hands the result to `read`. `--help` prints
  /// the help on stdout and exits 0; an Error from the parser or from `read` prints
  /// "program: message" and the usage line on stderr and exits 2.
  void run_main(int argc, char** argv, const std::function<void(const Args&)>& read) const;

 private:
  Parser& add(OptionSpec spec);
  OptionSpec integer_spec(const std::string& name, const std::string& metavar, const std::string& help,
                          Kind kind, int64_t min, int64_t max) const;
  OptionSpec choice_spec(const std::string& name, const std::vector<std::string>& allowed,
                         const std::string& help, Kind kind, const char* sep) const;
  const OptionSpec* find(const std::string& name) const;
  void check_value(const OptionSpec& spec, const std::string& value) const;

  std::string program_, usage_, about_, epilogue_;
  std::vector<OptionSpec> specs_;
  bool positionals_declared_ = false;
  std::string positional_what_;
  size_t positional_min_ = 0, positional_max_ = 0;
};

}  // namespace mtplab::cli
