// Launcher environments (see env.h). Every value is parsed strictly: the whole
// string must be a decimal integer (surrounding blanks allowed) within range, so
// a garbled variable is reported rather than read as 0. Nothing here prints.
#include "dist/store/env.h"

#include <charconv>
#include <limits>

#include "core/error.h"

namespace tandem::dist {
namespace {

constexpr size_t kMaxHosts = size_t(1) << 20;

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// Reads the environment for one launcher, naming it in every error.
class EnvReader {
 public:
  EnvReader(const std::string& launcher, const EnvGetter& getenv, const char* hint)
      : launcher_(launcher), getenv_(getenv), hint_(hint) {}

  // The variable's value, or nullptr when unset or empty.
  const char* find(const char* name) const {
    const char* v = getenv_(name);
    return (v && *v) ? v : nullptr;
  }

  std::string require(const char* name) const {
    const char* v = find(name);
    TANDEM_CHECK(v != nullptr, "launcher '", launcher_, "': environment variable ", name, " is not set; ",
                 hint_);
    return v;
  }

  int parse_int(const char* name, const std::string& value, int lo, int hi) const {
    const std::string t = trim(value);
    long long x = 0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), x);
    TANDEM_CHECK(!t.empty() && ec == std::errc() && end == t.data() + t.size(), "launcher '", launcher_,
                 "': environment variable ", name, "='", value, "' is not an integer");
    TANDEM_CHECK(x >= lo && x <= hi, "launcher '", launcher_, "': environment variable ", name, "=", x,
                 " is out of range, expected ", lo, " <= ", name, " <= ", hi);
    return static_cast<int>(x);
  }

  int require_int(const char* name, int lo, int hi = std::numeric_limits<int>::max()) const {
    return parse_int(name, require(name), lo, hi);
  }

  int int_or(const char* name, int fallback, int lo, int hi) const {
    const char* v = find(name);
    return v ? parse_int(name, v, lo, hi) : fallback;
  }

  [[noreturn]] void fail(const std::string& what) const { TANDEM_FAIL("launcher '", launcher_, "': ", what); }
  const std::string& launcher() const { return launcher_; }

 private:
  std::string launcher_;
  const EnvGetter& getenv_;
  const char* hint_;
};

void check_layout(const EnvReader& env, const DistEnv& d, const char* rank_var, const char* world_var,
                  const char* local_rank_var, const char* local_world_var) {
  TANDEM_CHECK(d.rank < d.world_size, "launcher '", env.launcher(), "': ", rank_var, "=", d.rank,
               " must be smaller than ", world_var, "=", d.world_size);
  TANDEM_CHECK(d.local_rank < d.local_world_size, "launcher '", env.launcher(), "': ", local_rank_var, "=",
               d.local_rank, " must be smaller than ", local_world_var, "=", d.local_world_size);
  TANDEM_CHECK(d.local_world_size <= d.world_size, "launcher '", env.launcher(), "': ", local_world_var, "=",
               d.local_world_size, " must not exceed ", world_var, "=", d.world_size);
}

DistEnv from_none(const EnvGetter& getenv) {
  EnvReader env("none", getenv, "");
  DistEnv d;
  d.launcher = "none";
  if (const char* a = env.find("MASTER_ADDR")) d.master_addr = trim(a);
  d.master_port = env.int_or("MASTER_PORT", kDefaultMasterPort, 1, 65535);
  return d;
}

DistEnv from_pytorch(const EnvGetter& getenv) {
  EnvReader env("pytorch", getenv, "launch with torchrun or tandem-run, or choose another --launcher");
  DistEnv d;
  d.launcher = "pytorch";
  d.rank = env.require_int("RANK", 0);
  d.world_size = env.require_int("WORLD_SIZE", 1);
  d.local_rank = env.require_int("LOCAL_RANK", 0);
  d.local_world_size = env.require_int("LOCAL_WORLD_SIZE", 1);
  d.node_rank = env.require_int("GROUP_RANK", 0);
  d.master_addr = trim(env.require("MASTER_ADDR"));
  d.master_port = env.require_int("MASTER_PORT", 1, 65535);
  check_layout(env, d, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  return d;
}

DistEnv from_slurm(const EnvGetter& getenv) {
  EnvReader env("slurm", getenv, "launch with srun inside a Slurm allocation, or choose another --launcher");
  DistEnv d;
  d.launcher = "slurm";
  d.rank = env.require_int("SLURM_PROCID", 0);
  d.world_size = env.require_int("SLURM_NTASKS", 1);
  d.local_rank = env.require_int("SLURM_LOCALID", 0);
  d.node_rank = env.require_int("SLURM_NODEID", 0);

  // Tasks on this node: the per-node list (uneven layouts) first, then the uniform count.
  bool found = false;
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const char* v = env.find(name);
    if (!v) continue;
    std::vector<int> per_node;
    try {
      per_node = expand_tasks_per_node(v);
    } catch (const Error& e) {
      env.fail(std::string("environment variable ") + name + "='" + v + "' is malformed: " + e.what());
    }
    TANDEM_CHECK(static_cast<size_t>(d.node_rank) < per_node.size(),
                 "launcher 'slurm': SLURM_NODEID=", d.node_rank, " but ", name, "='", v, "' lists only ",
                 per_node.size(), " node(s)");
    d.local_world_size = per_node[static_cast<size_t>(d.node_rank)];
    found = true;
    break;
  }
  if (!found) {
    const char* v = env.find("SLURM_NTASKS_PER_NODE");
    TANDEM_CHECK(v != nullptr,
                 "launcher 'slurm': none of SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE, "
                 "SLURM_NTASKS_PER_NODE is set; launch with srun inside a Slurm allocation");
    d.local_world_size = env.parse_int("SLURM_NTASKS_PER_NODE", v, 1, std::numeric_limits<int>::max());
  }
  check_layout(env, d, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "tasks per node");

  if (const char* a = env.find("MASTER_ADDR")) {
    d.master_addr = trim(a);
  } else {
    const char* list_name = nullptr;
    const char* list = nullptr;
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if ((list = env.find(name))) {
        list_name = name;
        break;
      }
    }
    TANDEM_CHECK(list != nullptr,
                 "launcher 'slurm': MASTER_ADDR is not set and neither is SLURM_STEP_NODELIST, "
                 "SLURM_JOB_NODELIST nor SLURM_NODELIST; set MASTER_ADDR to the host of rank 0");
    std::vector<std::string> hosts;
    try {
      hosts = expand_nodelist(list);
    } catch (const Error& e) {
      env.fail(std::string("environment variable ") + list_name + "='" + list +
               "' is malformed: " + e.what());
    }
    d.master_addr = hosts.front();
  }
  d.master_port = env.int_or("MASTER_PORT", kDefaultMasterPort, 1, 65535);
  return d;
}

DistEnv from_mpi(const EnvGetter& getenv) {
  EnvReader env("mpi", getenv, "launch with Open MPI's mpirun, or choose another --launcher");
  DistEnv d;
  d.launcher = "mpi";
  d.rank = env.require_int("OMPI_COMM_WORLD_RANK", 0);
  d.world_size = env.require_int("OMPI_COMM_WORLD_SIZE", 1);
  d.local_rank = env.require_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  d.local_world_size = env.require_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  check_layout(env, d, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE");
  // Open MPI names no node index; with its default by-slot mapping and equal
  // counts per node, node = rank / ranks per node.
  d.node_rank = d.rank / d.local_world_size;
  if (const char* a = env.find("MASTER_ADDR")) {
    d.master_addr = trim(a);
  } else {
    TANDEM_CHECK(d.local_world_size == d.world_size,
                 "launcher 'mpi': MASTER_ADDR is not set and the job spans "
                 "several nodes (OMPI_COMM_WORLD_SIZE=",
                 d.world_size, ", OMPI_COMM_WORLD_LOCAL_SIZE=", d.local_world_size,
                 "); pass the host of rank 0 with mpirun -x MASTER_ADDR=<host>");
    d.master_addr = "127.0.0.1";
  }
  d.master_port = env.int_or("MASTER_PORT", kDefaultMasterPort, 1, 65535);
  return d;
}

// One bracket range list "01-04,07" -> its names (as strings, zero padded).
std::vector<std::string> expand_ranges(const std::string& body, const std::string& whole) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t comma = body.find(',', pos);
    const std::string part = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    TANDEM_CHECK(!part.empty(), "node list '", whole, "': empty range in [", body, "]");
    const size_t dash = part.find('-');
    const std::string lo_s = part.substr(0, dash);
    const std::string hi_s = dash == std::string::npos ? lo_s : part.substr(dash + 1);
    auto parse = [&](const std::string& s) {
      TANDEM_CHECK(!s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos,
                   "node list '", whole, "': '", part, "' in [", body, "] is not a number or a range a-b");
      return std::stoull(s);
    };
    const unsigned long long lo = parse(lo_s), hi = parse(hi_s);
    TANDEM_CHECK(lo <= hi, "node list '", whole, "': range '", part, "' runs backwards");
    TANDEM_CHECK(hi - lo < kMaxHosts && out.size() + (hi - lo) < kMaxHosts, "node list '", whole,
                 "': more than ", kMaxHosts, " hosts");
    const size_t width = lo_s.size();
    for (unsigned long long x = lo; x <= hi; ++x) {
      std::string s = std::to_string(x);
      if (s.size() < width) s.insert(0, width - s.size(), '0');
      out.push_back(std::move(s));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// One host expression "gpu-[001-003]x" (no top-level comma) -> its names.
void expand_host(const std::string& item, const std::string& whole, std::vector<std::string>& out) {
  std::vector<std::string> names{""};
  size_t pos = 0;
  while (pos < item.size()) {
    const size_t open = item.find('[', pos);
    const std::string text = item.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    TANDEM_CHECK(text.find(']') == std::string::npos, "node list '", whole, "': unmatched ']' in '", item,
                 "'");
    for (std::string& n : names) n += text;
    if (open == std::string::npos) break;
    const size_t close = item.find(']', open);
    TANDEM_CHECK(close != std::string::npos, "node list '", whole, "': unmatched '[' in '", item, "'");
    const std::string body = item.substr(open + 1, close - open - 1);
    TANDEM_CHECK(body.find('[') == std::string::npos, "node list '", whole, "': nested '[' in '", item, "'");
    const std::vector<std::string> parts = expand_ranges(body, whole);
    TANDEM_CHECK(names.size() * parts.size() + out.size() <= kMaxHosts, "node list '", whole, "': more than ",
                 kMaxHosts, " hosts");
    std::vector<std::string> next;
    next.reserve(names.size() * parts.size());
    for (const std::string& n : names)
      for (const std::string& p : parts) next.push_back(n + p);
    names = std::move(next);
    pos = close + 1;
  }
  for (std::string& n : names) out.push_back(std::move(n));
}

}  // namespace

std::vector<std::string> expand_nodelist(const std::string& nodelist) {
  const std::string list = trim(nodelist);
  TANDEM_CHECK(!list.empty(), "node list is empty");
  TANDEM_CHECK(list.find_first_of(" \t\r\n") == std::string::npos, "node list '", list,
               "' contains blanks; expected Slurm's form such as node[01-04,07],login1");
  std::vector<std::string> out;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    TANDEM_CHECK(depth == 0 || depth == 1, "node list '", list, "': unbalanced brackets");
    if (c == ',' && depth == 0) {
      const std::string item = list.substr(start, i - start);
      TANDEM_CHECK(!item.empty(), "node list '", list, "': empty host name between commas");
      expand_host(item, list, out);
      start = i + 1;
    }
  }
  TANDEM_CHECK(depth == 0, "node list '", list, "': unmatched '['");
  return out;
}

std::vector<int> expand_tasks_per_node(const std::string& spec) {
  const std::string s = trim(spec);
  TANDEM_CHECK(!s.empty(), "tasks-per-node list is empty");
  std::vector<int> out;
  size_t pos = 0;
  auto number = [&](size_t& p, const char* what) {
    const size_t b = p;
    while (p < s.size() && s[p] >= '0' && s[p] <= '9') ++p;
    TANDEM_CHECK(p > b && p - b <= 9, "tasks-per-node list '", s, "': expected ", what, " at position ", b);
    return std::stoi(s.substr(b, p - b));
  };
  while (true) {
    const int tasks = number(pos, "a task count");
    TANDEM_CHECK(tasks >= 1, "tasks-per-node list '", s, "': a node with ", tasks, " tasks");
    int repeat = 1;
    if (pos < s.size() && s[pos] == '(') {
      TANDEM_CHECK(s.compare(pos, 2, "(x") == 0, "tasks-per-node list '", s, "': expected '(x' at position ",
                   pos);
      pos += 2;
      repeat = number(pos, "a repeat count");
      TANDEM_CHECK(pos < s.size() && s[pos] == ')', "tasks-per-node list '", s,
                   "': expected ')' at position ", pos);
      ++pos;
      TANDEM_CHECK(repeat >= 1 && out.size() + static_cast<size_t>(repeat) <= kMaxHosts,
                   "tasks-per-node list '", s, "': repeat count ", repeat, " out of range");
    }
    out.insert(out.end(), static_cast<size_t>(repeat), tasks);
    if (pos == s.size()) break;
    TANDEM_CHECK(s[pos] == ',', "tasks-per-node list '", s, "': expected ',' at position ", pos);
    ++pos;
  }
  return out;
}

DistEnv env_from_launcher(const std::string& launcher, const EnvGetter& getenv) {
  if (launcher == "none") return from_none(getenv);
  if (launcher == "pytorch") return from_pytorch(getenv);
  if (launcher == "slurm") return from_slurm(getenv);
  if (launcher == "mpi") return from_mpi(getenv);
  TANDEM_FAIL("unknown launcher '", launcher, "', expected none, pytorch, slurm or mpi");
}

int cuda_device_for(int local_rank, int visible_count, const std::string& visible_devices) {
  TANDEM_CHECK(visible_count > 0, "no CUDA device is visible to local rank ", local_rank,
               " (check CUDA_VISIBLE_DEVICES, or run on the CPU)");
  TANDEM_CHECK(local_rank >= 0, "local rank ", local_rank, " is negative");
  if (local_rank < visible_count) return local_rank;
  // One device named by the launcher for this process alone (e.g. srun --gpus-per-task=1).
  const bool one_named = !visible_devices.empty() && visible_devices.find(',') == std::string::npos;
  if (visible_count == 1 && one_named) return 0;
  TANDEM_FAIL("local rank ", local_rank, " has no GPU: only ", visible_count,
              " device(s) visible (CUDA_VISIBLE_DEVICES=", visible_devices.empty() ? "<unset>" : visible_devices,
              "); start at most ", visible_count,
              " processes per node, or give every process its own GPU (CUDA_VISIBLE_DEVICES naming one device)");
}

int cuda_device_for(int local_rank, int visible_count) {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return cuda_device_for(local_rank, visible_count, v ? v : "");
}

Device resolve_device(const std::string& text, int local_rank, int visible_count,
                      const std::string& visible_devices, const std::string& why_none) {
  if (text == "auto")
    return visible_count > 0 ? Device::cuda(cuda_device_for(local_rank, visible_count, visible_devices))
                             : Device::cpu();
  const Device d = Device::parse(text);
  if (d.is_cpu()) return d;
  TANDEM_CHECK(visible_count > 0, "--device ", text, ": no CUDA device is visible",
               why_none.empty() ? std::string() : " (" + why_none + ")", "; train on the CPU with --device cpu");
  if (text == "cuda") return Device::cuda(cuda_device_for(local_rank, visible_count, visible_devices));
  TANDEM_CHECK(d.index < visible_count, "--device ", text, ": only ", visible_count,
               " CUDA device(s) visible; name one of cuda:0 .. cuda:", visible_count - 1, ", or use --device cuda");
  return d;
}

Device resolve_device(const std::string& text, int local_rank) {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return resolve_device(text, local_rank, cuda_device_count(), v ? v : "", cuda_unavailable_reason());
}

}  // namespace tandem::dist
