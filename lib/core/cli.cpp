// Parser / Args: the declarations, the checks of parse() and the help layout.
#include "core/cli.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>

#include "core/error.hpp"
#include "core/str.hpp"

namespace mtplab::cli {
namespace {

// Indexed by Kind, in its declaration order.
constexpr const char* kKindNames[] = {
    "a flag", "a text", "an integer", "a number", "a list of integers", "a choice", "a list of choices"};
static_assert(std::size(kKindNames) == static_cast<size_t>(Kind::choice_list) + 1);
const char* kind_name(Kind kind) { return kKindNames[static_cast<size_t>(kind)]; }

std::vector<std::string> items_of(const std::string& value) { return split(value, ','); }

int64_t as_integer(const std::string& text) { return *parse_int64(text); }

OptionSpec make_spec(const std::string& name, const std::string& metavar, const std::string& help,
                     Kind kind) {
  OptionSpec s;
  s.name = name;
  s.metavar = metavar;
  s.help = help;
  s.kind = kind;
  return s;
}

}  // namespace

// ---- Args ----------------------------------------------------------------------------------------

const OptionSpec& Args::spec(const std::string& name, Kind kind) const {
  for (const auto& s : specs_)
    if (s.name == name) {
      MTP_REQUIRE(s.kind == kind, program_, ": option --", name, " is declared as ", kind_name(s.kind),
                  ", not read as ", kind_name(kind));
      return s;
    }
  MTP_FAIL(program_, ": option --", name, " was never declared");
}

const std::string* Args::last(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() || it->second.empty() ? nullptr : &it->second.back();
}

bool Args::flag(const std::string& name) const {
  spec(name, Kind::flag);
  return values_.count(name) > 0;
}

bool Args::has(const std::string& name) const { return values_.count(name) > 0; }

std::string Args::text(const std::string& name, const std::string& fallback) const {
  spec(name, Kind::text);
  const std::string* v = last(name);
  return v ? *v : fallback;
}

std::vector<std::string> Args::texts(const std::string& name) const {
  spec(name, Kind::text);
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

int64_t Args::integer(const std::string& name, int64_t fallback) const {
  spec(name, Kind::integer);
  const std::string* v = last(name);
  return v ? as_integer(*v) : fallback;
}

double Args::number(const std::string& name, double fallback) const {
  spec(name, Kind::number);
  const std::string* v = last(name);
  return v ? *parse_double(*v) : fallback;
}

std::vector<int64_t> Args::integers(const std::string& name, const std::vector<int64_t>& fallback) const {
  spec(name, Kind::integer_list);
  const std::string* v = last(name);
  if (!v) return fallback;
  std::vector<int64_t> out;
  for (const auto& item : items_of(*v)) out.push_back(as_integer(item));
  return out;
}

std::string Args::choice(const std::string& name, const std::string& fallback) const {
  spec(name, Kind::choice);
  const std::string* v = last(name);
  return v ? *v : fallback;
}

std::vector<std::string> Args::choices(const std::string& name,
                                       const std::vector<std::string>& fallback) const {
  spec(name, Kind::choice_list);
  const std::string* v = last(name);
  return v ? items_of(*v) : fallback;
}

// ---- Parser --------------------------------------------------------------------------------------

Parser::Parser(std::string program, std::string usage)
    : program_(std::move(program)), usage_(std::move(usage)) {}

Parser& Parser::about(std::string text) {
  about_ = std::move(text);
  return *this;
}

Parser& Parser::epilogue(std::string text) {
  epilogue_ = std::move(text);
  return *this;
}

Parser& Parser::add(OptionSpec spec) {
  MTP_REQUIRE(!spec.name.empty() && !starts_with(spec.name, "-") && spec.name != "help" && !find(spec.name),
              program_, ": option \"", spec.name, "\" declared twice, empty, reserved or with a leading '-'");
  specs_.push_back(std::move(spec));
  return *this;
}

Parser& Parser::flag(const std::string& name, const std::string& help) {
  return add(make_spec(name, "", help, Kind::flag));
}

Parser& Parser::text(const std::string& name, const std::string& metavar, const std::string& help) {
  return add(make_spec(name, metavar, help, Kind::text));
}

Parser& Parser::repeatable_text(const std::string& name, const std::string& metavar,
                                const std::string& help) {
  OptionSpec s = make_spec(name, metavar, help, Kind::text);
  s.repeatable = true;
  return add(std::move(s));
}

Parser& Parser::integer(const std::string& name, const std::string& metavar, const std::string& help,
                        int64_t min, int64_t max) {
  return add(integer_spec(name, metavar, help, Kind::integer, min, max));
}

Parser& Parser::number(const std::string& name, const std::string& metavar, const std::string& help,
                       double min, double max) {
  MTP_REQUIRE(min <= max, program_, ": --", name, ": empty range [", min, ", ", max, "]");
  OptionSpec s = make_spec(name, metavar, help, Kind::number);
  s.num_min = min;
  s.num_max = max;
  return add(std::move(s));
}

Parser& Parser::integer_list(const std::string& name, const std::string& metavar, const std::string& help,
                             int64_t min, int64_t max) {
  return add(integer_spec(name, metavar, help, Kind::integer_list, min, max));
}

Parser& Parser::choice(const std::string& name, const std::vector<std::string>& allowed,
                       const std::string& help) {
  return add(choice_spec(name, allowed, help, Kind::choice, "|"));
}

Parser& Parser::choice_list(const std::string& name, const std::vector<std::string>& allowed,
                            const std::string& help) {
  return add(choice_spec(name, allowed, help, Kind::choice_list, ","));
}

OptionSpec Parser::integer_spec(const std::string& name, const std::string& metavar, const std::string& help,
                                Kind kind, int64_t min, int64_t max) const {
  MTP_REQUIRE(min <= max, program_, ": --", name, ": empty range [", min, ", ", max, "]");
  OptionSpec s = make_spec(name, metavar, help, kind);
  s.int_min = min;
  s.int_max = max;
  return s;
}

OptionSpec Parser::choice_spec(const std::string& name, const std::vector<std::string>& allowed,
                               const std::string& help, Kind kind, const char* sep) const {
  MTP_REQUIRE(!allowed.empty(), program_, ": --", name, ": no choices");
  OptionSpec s = make_spec(name, join(allowed, sep), help, kind);
  s.allowed = allowed;
  return s;
}

Parser& Parser::positionals(std::string what, size_t min, size_t max) {
  MTP_REQUIRE(min <= max, program_, ": positionals: min ", min, " > max ", max);
  positionals_declared_ = true;
  positional_what_ = std::move(what);
  positional_min_ = min;
  positional_max_ = max;
  return *this;
}

const OptionSpec* Parser::find(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

void Parser::check_value(const OptionSpec& s, const std::string& value) const {
  const std::string opt = program_ + ": --" + s.name;
  // `item` of `value` read by `read`, else "expects <what>"; then within [lo, hi].
  auto in_range = [&](const std::string& item, auto read, auto lo, auto hi, const char* what) {
    const auto v = read(item);
    MTP_REQUIRE(v, opt, " expects ", what, ", got \"", value, "\"");
    MTP_REQUIRE(*v >= lo && *v <= hi, opt, " ", item, " is out of range [", lo, ", ", hi, "]");
  };
  auto allowed = [&](const std::string& item, const char* note) {
    MTP_REQUIRE(std::find(s.allowed.begin(), s.allowed.end(), item) != s.allowed.end(), opt, " \"", item,
                "\" is not one of ", join(s.allowed, ", "), note);
  };
  switch (s.kind) {
    case Kind::flag:
    case Kind::text:
      return;
    case Kind::integer:
      return in_range(value, parse_int64, s.int_min, s.int_max, "an integer");
    case Kind::number:
      return in_range(value, parse_double, s.num_min, s.num_max, "a number");
    case Kind::integer_list:
      for (const auto& item : items_of(value))
        in_range(item, parse_int64, s.int_min, s.int_max, "a comma list of integers (e.g. 1,2,4)");
      return;
    case Kind::choice:
      return allowed(value, "");
    case Kind::choice_list:
      for (const auto& item : items_of(value)) allowed(item, " (a comma list of them)");
      return;
  }
}

Args Parser::parse(const std::vector<std::string>& args) const {
  Args out;
  out.program_ = program_;
  out.specs_ = specs_;
  for (const auto& a : args) {
    if (a == "--") break;
    if (a == "-h" || a == "--help") {
      out.help_ = true;
      return out;
    }
  }
  const std::string see = str(" (see ", program_, " --help)");
  bool options_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (options_done || a.size() < 2 || a[0] != '-') {
      out.positional_.push_back(a);
      continue;
    }
    if (a == "--") {
      options_done = true;
      continue;
    }
    const size_t eq = a.find('=');
    const bool inline_value = starts_with(a, "--") && eq != std::string::npos;
    const std::string name =
        starts_with(a, "--") ? a.substr(2, inline_value ? eq - 2 : std::string::npos) : "";
    const OptionSpec* s = name.empty() ? nullptr : find(name);
    if (!s) {
      std::vector<std::string> known;
      for (const auto& spec : specs_) known.push_back("--" + spec.name);
      const std::string spelled = inline_value ? a.substr(0, eq) : a;
      const std::string meant = closest_match(spelled, known);
      MTP_FAIL(program_, ": unknown option \"", spelled, "\"",
               meant.empty() ? "" : str(", did you mean ", meant, "?"), see);
    }
    auto& values = out.values_[name];
    MTP_REQUIRE(values.empty() || s->repeatable, program_, ": --", name, " is given more than once", see);
    std::string value;
    if (s->kind == Kind::flag) {
      MTP_REQUIRE(!inline_value, program_, ": --", name, " takes no value (got \"", a, "\")");
    } else if (inline_value) {
      value = a.substr(eq + 1);
    } else {
      MTP_REQUIRE(i + 1 < args.size(), program_, ": --", name, " needs a value",
                  s->metavar.empty() ? "" : str(" (", s->metavar, ")"));
      value = args[++i];
    }
    check_value(*s, value);
    values.push_back(value);
  }
  const size_t n = out.positional_.size();
  if (!positionals_declared_) {
    MTP_REQUIRE(n == 0, program_, ": unexpected argument \"", n ? out.positional_.front() : "", "\"", see);
  } else {
    MTP_REQUIRE(n >= positional_min_, program_, ": expected ", positional_what_, ", got ", n, " argument(s)",
                see);
    if (n > positional_max_) {
      std::vector<std::string> quoted;
      for (const auto& p : out.positional_) quoted.push_back("\"" + p + "\"");
      MTP_FAIL(program_, ": expected ", positional_what_, ", got ", n, " arguments: ", join(quoted, ", "),
               see);
    }
  }
  return out;
}

std::string Parser::help() const {
  std::string out = str("usage: ", usage_, "\n");
  if (!about_.empty()) out += "\n" + about_;
  if (!about_.empty() && about_.back() != '\n') out += "\n";
  if (about_.empty() && !specs_.empty()) out += "\n";
  size_t width = 0;
  auto left = [](const OptionSpec& s) { return "--" + s.name + (s.metavar.empty() ? "" : " " + s.metavar); };
  for (const auto& s : specs_) width = std::max(width, left(s).size());
  for (const auto& s : specs_) {
    std::string l = left(s);
    l.resize(width + 2, ' ');
    const auto lines = split(s.help, '\n');
    out += "  " + l + lines.front() + "\n";
    for (size_t i = 1; i < lines.size(); ++i) out += std::string(width + 4, ' ') + lines[i] + "\n";
  }
  if (!epilogue_.empty()) out += epilogue_ + (epilogue_.back() == '\n' ? "" : "\n");
  return out;
}

void Parser::run_main(int argc, char** argv, const std::function<void(const Args&)>& read) const {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  try {
    const Args parsed = parse(args);
    if (parsed.help()) {
      std::fputs(help().c_str(), stdout);
      std::exit(0);
    }
    read(parsed);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\nusage: %s\n", e.message().c_str(), usage_.c_str());
    std::exit(2);
  }
}

}  // namespace mtplab::cli
