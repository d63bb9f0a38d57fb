// Tokens of a literal-style Python config (see py_config_tokens.h).
#include "train/py_config_tokens.h"

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace tandem::train::py {
namespace {

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The line of the first byte of `text` that is not valid UTF-8, or 0.
int first_bad_utf8_line(const std::string& text) {
  int line = 1;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    line += c == '\n';
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > text.size()) return line;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(text[i + k]) >> 6) != 2) return line;
    i += n;
  }
  return 0;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  Lexer(const std::string& text, const std::string& file) : s_(text), file_(file) {}
  std::vector<Token> run();

 private:
  void push(Token::Kind kind, std::string text, int line, size_t column);
  void newline();
  void string_token(char prefix, bool raw);
  void escape(std::string& out, int start_line);
  void number();
  void op();
  [[noreturn]] void fail(const std::string& what) const { fail_at(file_, line_, what); }

  const std::string& s_;
  const std::string& file_;
  size_t i_ = 0, line_start_ = 0;
  int line_ = 1;
  bool at_statement_start_ = true;
  std::vector<std::pair<char, int>> open_;  // brackets not yet closed, with their lines
  std::vector<Token> out_;
};

void Lexer::push(Token::Kind kind, std::string text, int line, size_t column) {
  Token t;
  t.kind = kind;
  t.text = std::move(text);
  t.line = line;
  t.indented = at_statement_start_ && column > 0;
  at_statement_start_ = false;
  out_.push_back(std::move(t));
}

void Lexer::newline() {
  if (!out_.empty() && out_.back().kind != Token::kNewline) out_.push_back(Token{Token::kNewline, "", line_});
  at_statement_start_ = true;
}

std::vector<Token> Lexer::run() {
  if (const int bad = first_bad_utf8_line(s_)) fail_at(file_, bad, "the file is not valid UTF-8");
  while (i_ < s_.size()) {
    const char c = s_[i_];
    if (c == '\n') {
      if (open_.empty()) newline();
      ++i_, ++line_, line_start_ = i_;
    } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f') {
      ++i_;
    } else if (c == '#') {
      while (i_ < s_.size() && s_[i_] != '\n') ++i_;
    } else if (c == '\\') {
      if (i_ + 1 < s_.size() && s_[i_ + 1] == '\n') {
        i_ += 2, ++line_, line_start_ = i_;
      } else if (i_ + 2 < s_.size() && s_[i_ + 1] == '\r' && s_[i_ + 2] == '\n') {
        i_ += 3, ++line_, line_start_ = i_;
      } else {
        fail("unexpected character after line continuation character");
      }
    } else if (c == '"' || c == '\'') {
      string_token(0, false);
    } else if (is_name_start(c)) {
      size_t j = i_;
      while (j < s_.size() && is_name_char(s_[j])) ++j;
      std::string name = s_.substr(i_, j - i_), lower;
      for (char ch : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      const bool prefix = lower.size() <= 2 && lower.find_first_not_of("rubf") == std::string::npos;
      if (prefix && j < s_.size() && (s_[j] == '"' || s_[j] == '\'')) {
        i_ = j;
        const char kind = lower.find('f') != std::string::npos ? 'f' : lower.find('b') != std::string::npos ? 'b' : 0;
        string_token(kind, lower.find('r') != std::string::npos);
      } else {
        push(Token::kName, std::move(name), line_, i_ - line_start_);
        i_ = j;
      }
    } else if (std::isdigit(static_cast<unsigned char>(c)) ||
               (c == '.' && i_ + 1 < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_ + 1])))) {
      number();
    } else {
      op();
    }
  }
  if (!open_.empty()) fail_at(file_, open_.back().second, std::string("'") + open_.back().first + "' was never closed");
  newline();
  out_.push_back(Token{Token::kEnd, "", line_});
  return std::move(out_);
}

void Lexer::string_token(char prefix, bool raw) {
  const int start_line = line_;
  const size_t column = i_ - line_start_;
  const char q = s_[i_];
  const bool triple = s_.compare(i_, 3, std::string(3, q)) == 0;
  i_ += triple ? 3 : 1;
  std::string value;
  for (;;) {
    if (i_ >= s_.size())
      fail_at(file_, start_line, triple ? "unterminated triple-quoted string" : "unterminated string");
    const char c = s_[i_];
    if (c == q && (!triple || s_.compare(i_, 3, std::string(3, q)) == 0)) {
      i_ += triple ? 3 : 1;
      break;
    }
    if (c == '\n') {
      if (!triple) fail_at(file_, start_line, "unterminated string");
      value += c, ++i_, ++line_, line_start_ = i_;
    } else if (c == '\\' && i_ + 1 < s_.size()) {
      if (raw) {
        value += c, value += s_[i_ + 1];
        if (s_[i_ + 1] == '\n') ++line_, line_start_ = i_ + 2;
        i_ += 2;
      } else {
        escape(value, start_line);
      }
    } else {
      value += c, ++i_;
    }
  }
  push(Token::kString, std::move(value), start_line, column);
  out_.back().prefix = prefix;
}

// One escape sequence at i_ (a backslash), decoded as Python decodes it in a str literal.
void Lexer::escape(std::string& out, int start_line) {
  const char e = s_[i_ + 1];
  i_ += 2;
  static const char* simple = "\\\\''\"\"a\ab\bf\fn\nr\rt\tv\v";
  for (const char* p = simple; *p; p += 2)
    if (e == p[0]) return void(out += p[1]);
  if (e == '\n') {  // a backslash at the end of a line continues the string
    ++line_;
    line_start_ = i_;
    return;
  }
  if (e >= '0' && e <= '7') {
    uint32_t v = e - '0';
    for (int k = 0; k < 2 && i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '7'; ++k) v = v * 8 + (s_[i_++] - '0');
    return append_utf8(out, v);
  }
  const int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
  if (digits == 0) {
    if (e == 'N') fail_at(file_, start_line, "a \\N{...} escape is not supported in a config string");
    out += '\\', out += e;  // Python keeps an unknown escape as written
    return;
  }
  uint32_t v = 0;
  for (int k = 0; k < digits; ++k, ++i_) {
    if (i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_])))
      fail_at(file_, start_line, std::string("truncated \\") + e + " escape");
    const char h = static_cast<char>(std::tolower(static_cast<unsigned char>(s_[i_])));
    v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
  }
  if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
    fail_at(file_, start_line, std::string("\\") + e + " escape names no character");
  append_utf8(out, v);
}

// A number as written (checked when it is read as a value): digits, letters, '_', '.', and a sign
// right after a decimal exponent's 'e'.
void Lexer::number() {
  const size_t start = i_;
  const bool based = s_[i_] == '0' && i_ + 1 < s_.size() && std::strchr("xXoObB", s_[i_ + 1]) && s_[i_ + 1] != 0;
  while (i_ < s_.size()) {
    const char c = s_[i_];
    if (is_name_char(c) || c == '.') {
      ++i_;
    } else if ((c == '+' || c == '-') && !based && (s_[i_ - 1] == 'e' || s_[i_ - 1] == 'E')) {
      ++i_;
    } else {
      break;
    }
  }
  push(Token::kNumber, s_.substr(start, i_ - start), line_, start - line_start_);
}

void Lexer::op() {
  static const char* const kOps[] = {"**=", "//=", ">>=", "<<=", "...", "->", ":=", "**", "//", "<<", ">>", "<=",
                                     ">=",  "==",  "!=",  "+=",  "-=",  "*=", "/=", "%=", "&=", "|=", "^=", "@="};
  std::string text;
  for (const char* o : kOps)
    if (s_.compare(i_, std::strlen(o), o) == 0) {
      text = o;
      break;
    }
  const char c = s_[i_];
  if (text.empty()) {
    if (!std::strchr("()[]{},:.;=+-*/%@&|^~<>", c) || c == 0) {
      const auto u = static_cast<unsigned char>(c);
      fail(u >= 0x80 ? "a non-ASCII character outside a string" : std::string("unexpected character '") + c + "'");
    }
    text = std::string(1, c);
  }
  if (c == ';' && open_.empty()) {  // the next statement starts here, on the same line
    ++i_;
    newline();
    at_statement_start_ = false;
    return;
  }
  if (text == "(" || text == "[" || text == "{") {
    if (open_.size() >= 200) fail("too many nested brackets (Python's limit is 200)");
    open_.emplace_back(c, line_);
  }
  if (text == ")" || text == "]" || text == "}") {
    if (open_.empty()) fail("unmatched '" + text + "'");
    const char want = open_.back().first == '(' ? ')' : open_.back().first == '[' ? ']' : '}';
    if (c != want) fail("closing '" + text + "' does not match opening '" + std::string(1, open_.back().first) + "'");
    open_.pop_back();
  }
  push(Token::kOp, text, line_, i_ - line_start_);
  i_ += text.size();
}

bool digit_part(std::string_view s, int base) {
  auto digit = [base](char c) {
    const int v = std::isdigit(static_cast<unsigned char>(c))   ? c - '0'
                  : std::isalpha(static_cast<unsigned char>(c)) ? std::tolower(static_cast<unsigned char>(c)) - 'a' + 10
                                                                : 99;
    return v < base;
  };
  if (s.empty() || !digit(s.front()) || !digit(s.back())) return false;
  for (size_t k = 0; k < s.size(); ++k)
    if (!(digit(s[k]) || (s[k] == '_' && digit(s[k + 1])))) return false;
  return true;
}

}  // namespace

bool read_digits(std::string_view s, int base, uint64_t* out, bool* overflow) {
  if (!digit_part(s, base)) return false;
  uint64_t v = 0;
  *overflow = false;
  for (char c : s) {
    if (c == '_') continue;
    const auto d =
        static_cast<uint64_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10);
    if (v > (UINT64_MAX - d) / static_cast<uint64_t>(base)) *overflow = true;
    v = v * static_cast<uint64_t>(base) + d;
  }
  *out = v;
  return true;
}

bool read_float(std::string_view s, double* out, bool digits_ok) {
  const size_t e = s.find_first_of("eE");
  std::string_view mantissa = s.substr(0, e), exponent = e == std::string_view::npos ? "" : s.substr(e + 1);
  if (e != std::string_view::npos) {
    if (!exponent.empty() && (exponent[0] == '+' || exponent[0] == '-')) exponent.remove_prefix(1);
    if (!digit_part(exponent, 10)) return false;
  }
  const size_t dot = mantissa.find('.');
  if (dot == std::string_view::npos) {
    if (!digit_part(mantissa, 10) || (e == std::string_view::npos && !digits_ok)) return false;
  } else {
    const std::string_view whole = mantissa.substr(0, dot), fraction = mantissa.substr(dot + 1);
    if (whole.empty() && fraction.empty()) return false;
    if ((!whole.empty() && !digit_part(whole, 10)) || (!fraction.empty() && !digit_part(fraction, 10))) return false;
  }
  std::string plain;
  for (char c : s)
    if (c != '_') plain += c;
  *out = std::strtod(plain.c_str(), nullptr);
  return true;
}

void fail_at(const std::string& file, int line, const std::string& what) { TANDEM_FAIL(file, ":", line, ": ", what); }

std::string describe(const Token& t) {
  if (t.kind == Token::kNewline) return "end of line";
  if (t.kind == Token::kEnd) return "end of file";
  if (t.kind == Token::kString) return "a string";
  return "'" + t.text + "'";
}

std::vector<Token> tokenize(const std::string& text, const std::string& file) { return Lexer(text, file).run(); }

}  // namespace tandem::train::py
