// The multi-node job's store token (see token.h).
#include "token.h"

#include <cstdlib>

#include "console.h"

namespace tandem::run {

std::string job_token(const RunOptions& o) {
  const char* env = std::getenv("TANDEM_STORE_TOKEN");
  if (env != nullptr && *env != '\0') return env;
  return o.run_id == "none" ? "" : o.run_id;
}

std::string store_token_env(const RunOptions& o) {
  const std::string token = job_token(o);
  if (token.empty()) {
    say("warning: this multi-node job's stores take any client that can reach them: give every node the same "
        "--rdzv-id (or set TANDEM_STORE_TOKEN) so that they refuse clients of other jobs");
    return "";
  }
  const char* env = std::getenv("TANDEM_STORE_TOKEN");
  return env != nullptr && *env != '\0' ? "" : "TANDEM_STORE_TOKEN=" + token;
}

}  // namespace tandem::run
