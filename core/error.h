// Errors and checks. Library code throws tandem::Error with a message built from any streamable
// arguments, written for the person who made the mistake (what was wrong, what was expected, the
// fix); the failing check's file:line travels beside it (where()), out of the message, so a user
// sees no source tags. Only apps catch: they print one line and exit (their --verbose adds where()).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, std::string where = "")
      : std::runtime_error(what), where_(std::move(where)) {}
  // "file.cpp:123" of the check that failed, or "" for an error thrown without one.
  const std::string& where() const { return where_; }

 private:
  std::string where_;
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
