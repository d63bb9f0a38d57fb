// Errors and checks. Library code throws tandem::Error carrying the failing
// check's file:line and a message built from any streamable arguments; only
// apps catch, print one line and exit.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace tandem

// TANDEM_CHECK(cond, "what was wrong: ", value, ", expected ", other)
#define TANDEM_CHECK(cond, ...)                                                               \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      ::tandem::detail::check_failed(__FILE__, __LINE__, #cond, ::tandem::detail::str_cat(__VA_ARGS__)); \
  } while (0)

// Throws unconditionally with the same context.
#define TANDEM_FAIL(...) \
  ::tandem::detail::check_failed(__FILE__, __LINE__, nullptr, ::tandem::detail::str_cat(__VA_ARGS__))
