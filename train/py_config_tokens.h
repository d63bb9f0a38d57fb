// The tokens of a literal-style Python config file (train/py_config.cpp reads them): names,
// numbers, strings (decoded), operators, and the end of each logical line. Brackets and backslashes
// join physical lines as Python's do; ';' ends a statement as a line does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::train::py {

struct Token {
  enum Kind { kName, kNumber, kString, kOp, kNewline, kEnd };
  Kind kind = kEnd;
  std::string text;       // the name, the number as written, the string's decoded value, the operator
  int line = 0;           // 1-based line of the token's first character
  char prefix = 0;        // strings: 'f' (f-string) or 'b' (bytes), else 0
  bool indented = false;  // the first token of a logical line, not at its line's first column
};

// The tokens of `text`, ending with kNewline (when there is a statement) and kEnd. Throws
// tandem::Error "<file>:<line>: ..." for text Python itself would not read (an unterminated string,
// an unmatched bracket, a character outside Python's syntax, invalid UTF-8, brackets nested past
// Python's limit of 200).
std::vector<Token> tokenize(const std::string& text, const std::string& file);

// Python's number syntax, sign not included. read_digits: digits of `base` with single '_' between
// them (false if not; *overflow set past 2**64-1). read_float: a decimal float ("1.5", ".5", "1.",
// "1e-3", "1_0.5"), or plain digits when `digits_ok`.
bool read_digits(std::string_view s, int base, uint64_t* out, bool* overflow);
bool read_float(std::string_view s, double* out, bool digits_ok);

// "<file>:<line>: " + what, thrown as tandem::Error.
[[noreturn]] void fail_at(const std::string& file, int line, const std::string& what);

// How a token reads in an error message: 'x', "a string", "end of line" or "end of file".
std::string describe(const Token& t);

}  // namespace tandem::train::py
