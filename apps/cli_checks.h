// Range and choice checks for the apps' CLI11 options whose messages read as a person writes a range:
// "--epochs: must be >= 1, got 0" (CLI11's own PositiveNumber prints the range's end, a
// 309-digit number). A missing value ("--auto-scale-lr --work-dir x") is named as missing.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>
#include <vector>

namespace tandem::app {

namespace detail {
inline std::string number_text(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// A validator accepting numbers v with `ok(v)`, described as `range` (">= 1", "between 1 and 9").
template <typename Ok>
CLI::Validator number_check(std::string range, Ok ok) {
  return CLI::Validator(
      [range, ok](std::string& text) -> std::string {
        if (text.rfind("--", 0) == 0) return "needs a value (a number " + range + ") before '" + text + "'";
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end == text.c_str() || *end != '\0')
          return "must be a number " + range + ", got '" + text + "'";
        return ok(v) ? std::string() : "must be " + range + ", got " + text;
      },
      range, "");
}
}  // namespace detail

// v >= low ("must be >= 1").
inline CLI::Validator at_least(double low) {
  return detail::number_check(">= " + detail::number_text(low), [low](double v) { return v >= low; });
}
// v > low ("must be > 0").
inline CLI::Validator above(double low) {
  return detail::number_check("> " + detail::number_text(low), [low](double v) { return v > low; });
}
// low <= v <= high ("must be between 1 and 65535").
inline CLI::Validator between(double low, double high) {
  return detail::number_check("between " + detail::number_text(low) + " and " + detail::number_text(high),
                              [low, high](double v) { return v >= low && v <= high; });
}

// One of `choices` ("--optimizer: 'rmsprop' is not one of adadelta, sgd, adam").
inline CLI::Validator one_of(std::vector<std::string> choices) {
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  return CLI::Validator(
      [choices, list](std::string& text) -> std::string {
        for (const std::string& c : choices)
          if (text == c) return "";
        return "'" + text + "' is not one of " + list;
      },
      "{" + list + "}", "");
}

}  // namespace tandem::app
