// Literal-style Python configs and --cfg-options values (see py_config.h).
#include "train/py_config.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "train/py_config_tokens.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;
using py::Token;

[[noreturn]] void refuse(const std::string& file, int line, const std::string& what) {
  py::fail_at(file, line, what + " is not supported in a config (only literals, dict(), lists, tuples and names "
                                 "assigned earlier)");
}

Json integer(uint64_t v) { return v <= INT64_MAX ? Json(static_cast<int64_t>(v)) : Json(v); }

// Reads one expression (or a statement's expression list) from the tokens, as Python evaluates a
// literal: names resolve in `names`; anything that would compute is refused.
class Parser {
 public:
  Parser(const std::vector<Token>& tokens, size_t pos, const std::string& file, const Json& names)
      : t_(tokens), pos_(pos), file_(file), names_(names) {}

  // The expression list up to the end of the statement (`a, b` is a tuple).
  Json statement_value() {
    Json first = expr();
    if (at(",")) {
      Json tuple = Json::array({std::move(first)});
      while (accept(",") && peek().kind != Token::kNewline) tuple.push_back(expr());
      first = std::move(tuple);
    }
    if (peek().kind != Token::kNewline) syntax(peek(), "invalid syntax at " + py::describe(peek()));
    return first;
  }

 private:
  const Token& peek() const { return t_[pos_]; }
  const Token& next() { return t_[pos_ < t_.size() - 1 ? pos_++ : pos_]; }
  bool at(const char* op) const { return peek().kind == Token::kOp && peek().text == op; }
  bool at_name(const char* name) const { return peek().kind == Token::kName && peek().text == name; }
  bool accept(const char* op) { return at(op) ? (++pos_, true) : false; }
  void expect(const char* op) {
    if (!accept(op))
      syntax(peek(), std::string("invalid syntax (expected '") + op + "', got " + py::describe(peek()) + ")");
  }
  [[noreturn]] void syntax(const Token& t, const std::string& what) const { py::fail_at(file_, t.line, what); }
  [[noreturn]] void refuse_at(const Token& t, const std::string& what) const { refuse(file_, t.line, what); }

  Json expr();
  Json unary();
  Json primary();
  Json name(const Token& t);
  Json number(const Token& t) const;
  Json strings(const Token& first);
  Json dict_call();
  Json sequence(const char* close, bool tuple);
  Json brace();
  void no_operator_after();
  void no_trailer();
  bool comprehension_ahead() const;

  const std::vector<Token>& t_;
  size_t pos_;
  const std::string& file_;
  const Json& names_;
};

Json Parser::expr() {
  Json v = unary();
  no_operator_after();
  return v;
}

// A value must end here: an operator after it would compute something.
void Parser::no_operator_after() {
  const Token& t = peek();
  static const std::map<std::string, std::string> ops = {
      {"+", "arithmetic"},  {"-", "arithmetic"},  {"*", "arithmetic"},  {"/", "arithmetic"},
      {"//", "arithmetic"}, {"%", "arithmetic"},  {"**", "arithmetic"}, {"@", "arithmetic"},
      {"<<", "arithmetic"}, {">>", "arithmetic"}, {"&", "arithmetic"},  {"|", "arithmetic"},
      {"^", "arithmetic"},  {"<", "a comparison"}, {">", "a comparison"}, {"<=", "a comparison"},
      {">=", "a comparison"}, {"==", "a comparison"}, {"!=", "a comparison"},
      {":=", "an assignment expression"},
      {"and", "a boolean operator"}, {"or", "a boolean operator"}, {"not", "a comparison"},
      {"in", "a comparison"}, {"is", "a comparison"}, {"if", "a conditional expression"},
      {"for", "a comprehension"}, {"async", "a comprehension"}};
  if (t.kind != Token::kOp && t.kind != Token::kName) return;
  auto it = ops.find(t.text);
  if (it != ops.end()) refuse_at(t, it->second);
}

Json Parser::unary() {
  const Token& t = peek();
  if (at("-") || at("+")) {
    next();
    if (peek().kind != Token::kNumber && !at("-") && !at("+")) refuse_at(t, "arithmetic");
    Json v = unary();
    if (t.text == "+") return v;
    if (v.is_number_float()) return Json(-v.get<double>());
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > (uint64_t{1} << 63)) syntax(t, "integer -" + std::to_string(u) + " is too large for a config");
      return Json(u == (uint64_t{1} << 63) ? INT64_MIN : -static_cast<int64_t>(u));
    }
    const int64_t i = v.get<int64_t>();
    return i == INT64_MIN ? Json(uint64_t{1} << 63) : Json(-i);
  }
  if (at("~")) refuse_at(t, "arithmetic");
  if (at("*") || at("**")) refuse_at(t, "unpacking");
  if (at_name("not")) refuse_at(t, "a boolean operator");
  if (at_name("lambda")) refuse_at(t, "lambda");
  if (at_name("await") || at_name("yield")) refuse_at(t, "'" + t.text + "'");
  return primary();
}

Json Parser::primary() {
  const Token& t = next();
  Json v;
  if (t.kind == Token::kNumber) {
    v = number(t);
  } else if (t.kind == Token::kString) {
    v = strings(t);
  } else if (t.kind == Token::kName) {
    v = name(t);
  } else if (t.kind == Token::kOp && t.text == "(") {
    v = sequence(")", true);
  } else if (t.kind == Token::kOp && t.text == "[") {
    v = sequence("]", false);
  } else if (t.kind == Token::kOp && t.text == "{") {
    v = brace();
  } else if (t.kind == Token::kOp && t.text == "...") {
    refuse_at(t, "Ellipsis (...)");
  } else {
    syntax(t, "invalid syntax at " + py::describe(t));
  }
  no_trailer();
  return v;
}

// What may follow a value in Python but is not a literal: a call, an attribute, a subscript.
void Parser::no_trailer() {
  if (at("(")) refuse_at(peek(), "a function call");
  if (at(".")) refuse_at(peek(), "attribute access");
  if (at("[")) refuse_at(peek(), "subscripting");
}

Json Parser::name(const Token& t) {
  static const char* const keywords[] = {"and", "as", "assert", "async", "await", "break", "class", "continue",
                                         "def", "del", "elif", "else", "except", "finally", "for", "from",
                                         "global", "if", "import", "in", "is", "lambda", "nonlocal", "not",
                                         "or", "pass", "raise", "return", "try", "while", "with", "yield"};
  if (t.text == "True" || t.text == "False") return Json(t.text == "True");
  if (t.text == "None") return Json();
  for (const char* k : keywords)
    if (t.text == k) syntax(t, "invalid syntax at '" + t.text + "'");
  if (at("(")) {
    if (t.text != "dict") refuse_at(t, "a function call (" + t.text + "(...))");
    next();
    return dict_call();
  }
  no_trailer();
  if (!names_.contains(t.text)) py::fail_at(file_, t.line, "name '" + t.text + "' is not defined");
  return names_[t.text];
}

Json Parser::number(const Token& t) const {
  const std::string& s = t.text;
  if (s.back() == 'j' || s.back() == 'J') refuse_at(t, "a complex number");
  uint64_t v = 0;
  bool overflow = false;
  if (s.size() > 1 && s[0] == '0' && std::strchr("xXoObB", s[1])) {
    const int base = std::tolower(s[1]) == 'x' ? 16 : std::tolower(s[1]) == 'o' ? 8 : 2;
    std::string_view digits(s);
    digits.remove_prefix(s.size() > 2 && s[2] == '_' ? 3 : 2);
    if (!py::read_digits(digits, base, &v, &overflow)) syntax(t, "invalid number '" + s + "'");
  } else if (s.find_first_of(".eE") != std::string::npos) {
    double d = 0;
    if (!py::read_float(s, &d, false)) syntax(t, "invalid number '" + s + "'");
    return Json(d);
  } else {
    if (!py::read_digits(s, 10, &v, &overflow)) syntax(t, "invalid number '" + s + "'");
    if (s[0] == '0' && s.find_first_not_of("0_") != std::string::npos)
      syntax(t, "leading zeros in decimal integer literals are not permitted ('" + s + "')");
  }
  if (overflow) syntax(t, "integer " + s + " is too large for a config");
  return integer(v);
}

// Adjacent string literals are one string, as in Python.
Json Parser::strings(const Token& first) {
  std::string out;
  for (const Token* t = &first;; t = &next()) {
    if (t->prefix == 'f') refuse_at(*t, "an f-string");
    if (t->prefix == 'b') refuse_at(*t, "a bytes literal");
    out += t->text;
    if (peek().kind != Token::kString) break;
  }
  return Json(std::move(out));
}

// dict(k=v, ...), after "dict(".
Json Parser::dict_call() {
  Json obj = Json::object();
  while (!accept(")")) {
    if (at("**")) refuse_at(peek(), "unpacking (**)");
    const Token& key = peek();
    if (key.kind != Token::kName || t_[pos_ + 1].kind != Token::kOp || t_[pos_ + 1].text != "=")
      refuse_at(key, "dict() with a positional argument");
    pos_ += 2;
    if (obj.contains(key.text)) syntax(key, "keyword argument repeated: " + key.text);
    obj[key.text] = expr();
    if (!accept(",")) {
      expect(")");
      break;
    }
  }
  return obj;
}

// True when a 'for' stands at the level of the bracket just opened, before it closes.
bool Parser::comprehension_ahead() const {
  int depth = 0;
  for (size_t i = pos_; t_[i].kind != Token::kEnd; ++i) {
    const Token& x = t_[i];
    if (x.kind == Token::kName && x.text == "for" && depth == 0) return true;
    if (x.kind != Token::kOp) continue;
    if (x.text == "(" || x.text == "[" || x.text == "{") ++depth;
    if ((x.text == ")" || x.text == "]" || x.text == "}") && depth-- == 0) return false;
  }
  return false;
}

// [a, b] or (a, b) after the opening bracket; (a) is a, (a,) a one-element tuple; both are arrays.
Json Parser::sequence(const char* close, bool tuple) {
  Json arr = Json::array();
  if (comprehension_ahead()) refuse_at(peek(), "a comprehension");
  if (accept(close)) return arr;
  Json first = expr();
  if (tuple && accept(close)) return first;
  arr.push_back(std::move(first));
  while (accept(",")) {
    if (accept(close)) return arr;
    arr.push_back(expr());
  }
  expect(close);
  return arr;
}

// {'k': v, ...} after "{".
Json Parser::brace() {
  Json obj = Json::object();
  if (comprehension_ahead()) refuse_at(peek(), "a comprehension");
  while (!accept("}")) {
    if (at("**")) refuse_at(peek(), "unpacking (**)");
    const Token& at_key = peek();
    const Json key = expr();
    if (!at(":")) refuse_at(at_key, "a set");
    if (!key.is_string()) refuse_at(at_key, "a dict key that is not a string");
    next();
    obj[key.get<std::string>()] = expr();
    if (!accept(",")) {
      expect("}");
      break;
    }
  }
  return obj;
}

// One statement of the file: `target = value` (target "" for a bare expression), its value's first
// token and its line.
struct Statement {
  std::string target;
  size_t begin = 0;
  int line = 0;
};

// The refusal for a statement that starts with `kw`, or "" when `kw` starts no statement.
std::string statement_keyword(const std::string& kw) {
  if (kw == "import" || kw == "from") return "import";
  if (kw == "def") return "a function definition";
  if (kw == "class") return "a class definition";
  static const char* const others[] = {"if", "elif", "else", "for", "while", "try", "except", "finally", "with",
                                       "async", "del", "global", "nonlocal", "assert", "raise", "return", "pass",
                                       "break", "continue", "yield"};
  for (const char* o : others)
    if (kw == o) return "the '" + kw + "' statement";
  return "";
}

// The file's statements, each checked for its shape (assignments to one name, or expressions).
std::vector<Statement> statements(const std::vector<Token>& t, const std::string& file) {
  std::vector<Statement> out;
  for (size_t b = 0; t[b].kind != Token::kEnd; ++b) {
    const Token& first = t[b];
    if (first.indented) py::fail_at(file, first.line, "unexpected indent");
    if (first.kind == Token::kName && !statement_keyword(first.text).empty())
      refuse(file, first.line, statement_keyword(first.text));
    Statement s{"", b, first.line};
    const bool assignment = first.kind == Token::kName && t[b + 1].kind == Token::kOp && t[b + 1].text == "=";
    if (assignment) s = {first.text, b + 2, first.line};
    if (first.kind == Token::kName && t[b + 1].kind == Token::kOp && t[b + 1].text == ":")
      refuse(file, first.line, "an annotated assignment");
    int depth = 0;
    size_t e = assignment ? b + 2 : b;
    for (; t[e].kind != Token::kNewline; ++e) {
      const Token& x = t[e];
      if (x.kind == Token::kName && x.text == "lambda") break;  // its defaults are no assignment
      if (x.kind != Token::kOp) continue;
      depth += (x.text == "(" || x.text == "[" || x.text == "{") - (x.text == ")" || x.text == "]" || x.text == "}");
      if (depth != 0) continue;
      if (x.text == "=") refuse(file, x.line, assignment ? "chained assignment" : "assignment to anything but a name");
      if (x.text.size() >= 2 && x.text.back() == '=' && x.text != "==" && x.text != "<=" && x.text != ">=" &&
          x.text != "!=" && x.text != ":=")
        refuse(file, x.line, "augmented assignment (" + x.text + ")");
    }
    while (t[e].kind != Token::kNewline) ++e;
    out.push_back(std::move(s));
    b = e;
  }
  return out;
}

// MMEngine's predefined variables ({{ fileDirname }} ...) replaced in the text, as MMEngine does
// before it runs the file.
std::string substitute_predefined(const std::string& text, const fs::path& path) {
  if (text.find("{{") == std::string::npos) return text;
  const fs::path abs = fs::absolute(path);
  const std::pair<const char*, std::string> vars[] = {{"fileDirname", abs.parent_path().string()},
                                                      {"fileBasename", abs.filename().string()},
                                                      {"fileBasenameNoExtension", abs.stem().string()},
                                                      {"fileExtname", abs.extension().string()}};
  std::string out = text;
  for (const auto& [key, value] : vars) {
    const std::regex re(std::string("\\{\\{\\s*") + key + "\\s*\\}\\}");
    std::string replaced;
    auto last = out.cbegin();
    for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
      replaced.append(last, (*it)[0].first).append(value);
      last = (*it)[0].second;
    }
    out = replaced.append(last, out.cend());
  }
  return out;
}

// MMEngine's other {{...}} forms (a base's variable, an environment variable) are refused.
void refuse_templates(const std::string& text, const std::string& file) {
  static const std::regex base(R"(\{\{\s*_base_\.)"), env(R"(\{\{['"]?\s*\$\w+\s*:)");
  std::smatch m;
  for (const auto& [re, what] : {std::pair{&base, "{{_base_.xxx}} (name the base's variable instead)"},
                                 std::pair{&env, "an environment variable ({{$NAME:default}})"}})
    if (std::regex_search(text, m, *re)) {
      const auto line = 1 + std::count(text.begin(), text.begin() + m.position(0), '\n');
      refuse(file, static_cast<int>(line), what);
    }
}

std::string kind_of(const Json& v) {
  if (v.is_array()) return "a list";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a bool";
  if (v.is_number()) return "a number";
  return "None";
}

// MMEngine's rule on merging a dict onto a base: the base's value must be a dict too, unless the
// dict has _delete_=True (which must be a bool). `base` is null where the base has no such key.
void check_inheritable(const Json* base, const Json& child, const std::string& path, const std::string& file,
                       int line) {
  if (child.contains("_delete_")) {
    if (!child["_delete_"].is_boolean()) py::fail_at(file, line, "'" + path + "._delete_' must be True or False");
    if (child["_delete_"].get<bool>()) base = nullptr;
  }
  if (base && !base->is_object())
    py::fail_at(file, line, "'" + path + "' is a dict here but " + kind_of(*base) +
                                " in a _base_ config; set _delete_=True in it to replace the base's value");
  for (const auto& [key, value] : child.items())
    if (value.is_object())
      check_inheritable(base && base->contains(key) ? &(*base)[key] : nullptr, value, path + "." + key, file, line);
}

class Loader {
 public:
  Json load(const fs::path& path);

 private:
  Json load_bases(const fs::path& path, const Json& spec, int line);
  std::vector<std::pair<std::string, std::string>> chain_;  // files being loaded: canonical path, as shown
};

Json Loader::load(const fs::path& path) {
  const std::string file = path.string();
  std::ifstream in(path, std::ios::binary);
  TANDEM_CHECK(in.good() && !fs::is_directory(path), "cannot read config file '", file, "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = substitute_predefined(buffer.str(), path);
  refuse_templates(text, file);
  const std::vector<Token> tokens = py::tokenize(text, file);
  const std::vector<Statement> stmts = statements(tokens, file);
  chain_.emplace_back(fs::weakly_canonical(path).string(), file);
  const Json none = Json::object();
  Json spec;
  int base_line = 0;
  for (const Statement& s : stmts) {  // bases first, wherever _base_ is assigned (as MMEngine)
    if (s.target != "_base_") continue;
    spec = Parser(tokens, s.begin, file, none).statement_value();
    base_line = s.line;
  }
  const Json base = base_line ? load_bases(path, spec, base_line) : Json::object();
  Json names = base, own = Json::object();
  std::map<std::string, int> lines;
  for (const Statement& s : stmts) {
    if (s.target == "_base_") continue;
    Json value = Parser(tokens, s.begin, file, names).statement_value();
    if (s.target.empty()) continue;  // an expression statement (a docstring): no key
    names[s.target] = value;
    own[s.target] = std::move(value);
    lines[s.target] = s.line;
  }
  chain_.pop_back();
  if (!base_line) return own;
  for (const auto& [key, value] : own.items())
    if (value.is_object()) check_inheritable(base.contains(key) ? &base[key] : nullptr, value, key, file, lines[key]);
  return merge_inherited(base, own);
}

// The bases named by `spec` (a path or a list of paths), loaded in order; no two may set one key.
Json Loader::load_bases(const fs::path& path, const Json& spec, int line) {
  const std::string file = path.string();
  std::vector<std::string> names;
  if (spec.is_string()) names.push_back(spec.get<std::string>());
  for (const Json& n : spec.is_array() ? spec : Json::array()) {
    if (!n.is_string()) py::fail_at(file, line, "_base_ must be a path or a list of paths");
    names.push_back(n.get<std::string>());
  }
  if (!spec.is_string() && !spec.is_array()) py::fail_at(file, line, "_base_ must be a path or a list of paths");
  Json merged = Json::object();
  std::map<std::string, std::string> owner;
  for (const std::string& name : names) {
    if (name.find("::") != std::string::npos)
      py::fail_at(file, line, "_base_ '" + name + "' names another package's config, which cannot be read here");
    const fs::path p = (path.parent_path() / name).lexically_normal();
    if (!fs::exists(p)) py::fail_at(file, line, "_base_ '" + name + "' not found (" + p.string() + ")");
    const std::string key = fs::weakly_canonical(p).string();
    for (size_t i = 0; i < chain_.size(); ++i) {
      if (chain_[i].first != key) continue;
      std::string cycle;
      for (size_t k = i; k < chain_.size(); ++k) cycle += chain_[k].second + " -> ";
      py::fail_at(file, line, "_base_ '" + name + "' inherits from itself: " + cycle + p.string());
    }
    Json b;
    if (p.extension() == ".py") {
      b = load(p);
    } else if (p.extension() == ".json") {
      b = load_config_with_bases(p.string());
      if (!b.is_object()) py::fail_at(file, line, "_base_ '" + name + "' is not a JSON object");
    } else {
      py::fail_at(file, line, "_base_ '" + name + "': only .py and .json configs can be read");
    }
    for (auto& [k, v] : b.items()) {
      if (merged.contains(k))
        py::fail_at(file, line, "_base_ files '" + owner[k] + "' and '" + name + "' both set '" + k +
                                    "' (a key may come from one base only)");
      merged[k] = std::move(v);
      owner[k] = name;
    }
  }
  return merged;
}

// Python's int() and float() of a --cfg-options element (surrounding whitespace ignored).
bool python_number(std::string_view s, Json* out) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  const bool negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  uint64_t u = 0;
  bool overflow = false;
  if (py::read_digits(s, 10, &u, &overflow)) {
    TANDEM_CHECK(!overflow && (!negative || u <= (uint64_t{1} << 63)), "--cfg-options: integer '", s,
                 "' is out of range");
    *out = !negative ? integer(u) : u == (uint64_t{1} << 63) ? Json(INT64_MIN) : Json(-static_cast<int64_t>(u));
    return true;
  }
  std::string lower;
  for (char c : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double d = 0;
  if (lower == "inf" || lower == "infinity" || lower == "nan")
    d = lower == "nan" ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (!py::read_float(s, &d, true))
    return false;
  *out = Json(negative ? -d : d);
  return true;
}

// DictAction._parse_int_float_bool.
Json scalar(const std::string& s) {
  Json v;
  if (python_number(s, &v)) return v;
  std::string lower;
  for (char c : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "true" || lower == "false") return Json(lower == "true");
  if (s == "None") return Json();
  return Json(s);
}

bool balanced(std::string_view s) {
  return std::count(s.begin(), s.end(), '(') == std::count(s.begin(), s.end(), ')') &&
         std::count(s.begin(), s.end(), '[') == std::count(s.begin(), s.end(), ']');
}

// DictAction._parse_iterable.
Json iterable(std::string val, const std::string& whole, int depth = 0) {
  TANDEM_CHECK(depth < 200, "--cfg-options: value '", whole.substr(0, 80), "...' nests too deep");
  const size_t first = val.find_first_not_of("'\""), last = val.find_last_not_of("'\"");
  val = first == std::string::npos ? "" : val.substr(first, last - first + 1);
  val.erase(std::remove(val.begin(), val.end(), ' '), val.end());
  const bool bracketed = val.size() >= 2 && ((val.front() == '(' && val.back() == ')') ||
                                             (val.front() == '[' && val.back() == ']'));
  if (bracketed) {
    val = val.substr(1, val.size() - 2);
  } else if (val.find(',') == std::string::npos) {
    return scalar(val);
  }
  Json values = Json::array();
  while (!val.empty()) {
    TANDEM_CHECK(balanced(val), "--cfg-options: value '", whole, "': brackets do not balance in '", val, "'");
    size_t comma = 0;
    while (comma < val.size() && !(val[comma] == ',' && balanced(std::string_view(val).substr(0, comma)))) ++comma;
    // Without brackets and with no comma to split at, MMEngine would read the same text again.
    TANDEM_CHECK(bracketed || comma < val.size() || !values.empty(), "--cfg-options: value '", whole,
                 "': no comma outside brackets splits '", val, "'");
    values.push_back(iterable(val.substr(0, comma), whole, depth + 1));
    val = comma < val.size() ? val.substr(comma + 1) : "";
  }
  return values;
}

}  // namespace

Json load_py_config(const std::string& path) {
  Loader loader;
  return loader.load(path);
}

Json parse_cfg_option_value(const std::string& text) { return iterable(text, text); }

}  // namespace tandem::train
