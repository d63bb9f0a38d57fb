// tandem-run's options (see options.h). Usage errors print one line and end
// with exit code 2, as argparse (and so torchrun) does.
#include "options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "cli_checks.h"
#include "etcd_client.h"

namespace tandem::run {

namespace {

// One count: "" or what is wrong with it.
std::string parse_count(const std::string& text, const std::string& what, int& out) {
  try {
    size_t used = 0;
    out = std::stoi(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
  } catch (const std::exception&) {
    return what + ": '" + text + "' is not a number";
  }
  return "";
}

// --nproc-per-node N|cpu|gpu|auto into o.nproc_per_node.
std::string parse_nproc(const std::string& nproc, RunOptions& o) {
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (nproc == "cpu") {
    o.nproc_per_node = cpus;
  } else if (nproc == "gpu") {
    o.nproc_per_node = visible_gpu_count();
    if (o.nproc_per_node == 0)
      return "--nproc-per-node gpu: no GPU is visible (CUDA_VISIBLE_DEVICES, /proc/driver/nvidia/gpus)";
  } else if (nproc == "auto") {
    const int gpus = visible_gpu_count();
    o.nproc_per_node = gpus > 0 ? gpus : cpus;
  } else {
    if (!parse_count(nproc, "--nproc-per-node", o.nproc_per_node).empty())
      return "--nproc-per-node: '" + nproc + "' is not a number, cpu, gpu or auto";
    if (o.nproc_per_node < 1) return "--nproc-per-node must be >= 1, got " + nproc;
  }
  return "";
}

// --nnodes N or MIN:MAX into o.nnodes (the most) and o.min_nodes.
std::string parse_nnodes(const std::string& nnodes, RunOptions& o) {
  const size_t colon = nnodes.find(':');
  if (colon == std::string::npos) {
    if (std::string err = parse_count(nnodes, "--nnodes", o.nnodes); !err.empty()) return err;
    if (o.nnodes < 1) return "--nnodes must be >= 1, got " + nnodes;
    o.min_nodes = o.nnodes;
    return "";
  }
  const std::string expected = "--nnodes " + nnodes + ": expected N or MIN:MAX with 1 <= MIN <= MAX";
  if (!parse_count(nnodes.substr(0, colon), "--nnodes", o.min_nodes).empty() ||
      !parse_count(nnodes.substr(colon + 1), "--nnodes", o.nnodes).empty() || o.min_nodes < 1 ||
      o.nnodes < o.min_nodes)
    return expected;
  return "";
}

// --rdzv-conf KEY=VALUE,... (seconds) into o.
std::string parse_rdzv_conf(const std::string& conf, RunOptions& o) {
  size_t start = 0;
  while (start < conf.size()) {
    size_t comma = conf.find(',', start);
    if (comma == std::string::npos) comma = conf.size();
    const std::string item = conf.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    double* target = key == "join_timeout"                             ? &o.join_timeout
                     : key == "last_call_timeout"                      ? &o.last_call_timeout
                     : key == "timeout" || key == "read_timeout"       ? &o.store_timeout
                                                                       : nullptr;
    if (target == nullptr)
      return "--rdzv-conf: unknown key '" + key + "'; expected join_timeout, last_call_timeout or timeout";
    try {
      size_t used = 0;
      const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
      *target = std::stod(value, &used);
      if (used != value.size() || !(*target > 0)) throw std::invalid_argument(value);
    } catch (const std::exception&) {
      return "--rdzv-conf " + item + ": expected " + key + "=SECONDS with SECONDS > 0";
    }
  }
  return "";
}

// --rdzv-endpoint HOST:PORT[,HOST:PORT...] of the etcd backend into o.etcd_endpoints.
std::string parse_etcd_endpoints(const std::string& text, RunOptions& o) {
  if (text.empty()) return "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT[,HOST:PORT...] naming the etcd members";
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(start, comma - start);
    start = comma + 1;
    try {
      etcd_url(item);
    } catch (const std::invalid_argument& e) {
      return "--rdzv-endpoint " + text + ": " + e.what();
    }
    o.etcd_endpoints.push_back(item);
  }
  return "";
}

}  // namespace

int parse_options(int argc, char** argv, RunOptions& o) {
  CLI::App app{
      "tandem-run: start PROGRAM once per local rank with torchrun's environment (RANK, LOCAL_RANK, "
      "WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), forward its output and "
      "signals, and end the whole group when one worker fails. With several nodes (--nnodes N > 1 or MIN:MAX) "
      "the agents first meet in a rendezvous at --master-addr:--master-port and restart together.",
      "tandem-run"};
  app.footer("Usage: tandem-run [OPTIONS] PROGRAM [ARGS...]");
  app.option_defaults()->always_capture_default();
  app.prefix_command();  // PROGRAM and everything after it belong to the worker
  std::string nproc = "1";
  std::string nnodes = "1";
  app.add_option("--nproc-per-node,--nproc_per_node", nproc,
                 "workers on this node: a number, cpu (one per core), gpu (one per visible GPU) or auto "
                 "(gpu if there is one, else cpu)");
  app.add_option("--nnodes", nnodes,
                 "number of nodes (one tandem-run per node), or MIN:MAX for an elastic job that starts once MIN "
                 "nodes joined and goes on with the nodes left (at least MIN) after a node is lost");
  CLI::Option* node_rank_opt =
      app.add_option("--node-rank,--node_rank", o.node_rank,
                     "this node's index, 0 .. nnodes-1 (kept in every round; without it, a multi-node job numbers "
                     "its nodes by arrival, the rendezvous host first)")
          ->check(tandem::app::at_least(0));
  app.add_option("--master-addr,--master_addr", o.master_addr, "one node: rank 0's store address; several: the rendezvous host (node 0)");
  app.add_option("--master-port,--master_port", o.master_port, "one node: rank 0's store port; several: the rendezvous store's port (the workers get another)")
      ->check(tandem::app::between(1, 65535));
  app.add_flag("--standalone", o.standalone, "one node: listen on 127.0.0.1 and pick a free port");
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "restart the whole worker group up to this many times after a failure (with several nodes: "
                 "every node's group together, the count shared by all nodes)")
      ->check(tandem::app::at_least(0));
  app.add_option("--log-dir,--log_dir", o.log_dir,
                 "write each rank's stdout and stderr to DIR/rank_<r>.log instead of the console");
  app.add_option("--grace-period", o.grace_seconds, "seconds between SIGTERM and SIGKILL when ending workers")
      ->check(tandem::app::at_least(0));
  bool no_python = false;
  app.add_flag("--no-python,--no_python", no_python, "accepted for torchrun compatibility (always the case)");
  bool use_env = false;
  app.add_flag("--use-env,--use_env", use_env,
               "accepted for torch.distributed.launch compatibility: workers always get LOCAL_RANK in the "
               "environment, and nothing is appended to their command line");
  std::string rdzv_endpoint, rdzv_backend = "static";
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", rdzv_endpoint,
                 "c10d: HOST[:PORT], the same as --master-addr HOST --master-port PORT; etcd: the etcd members, "
                 "HOST:PORT[,HOST:PORT...]");
  app.add_option("--local-addr,--local_addr", o.local_addr,
                 "etcd: this node's address as the other nodes reach it (default: its source address towards the "
                 "first etcd member)");
  app.add_option("--rdzv-id,--rdzv_id", o.run_id, "the job's id, the same on every node and new for every job: the workers' TORCHELASTIC_RUN_ID, and the "
                 "token of a multi-node job's stores unless TANDEM_STORE_TOKEN is set");
  app.add_option("--rdzv-backend,--rdzv_backend", rdzv_backend,
                 "c10d or static: a TCP store at the rendezvous endpoint, served by the agent on that host; etcd "
                 "(or etcd-v2): an etcd cluster at --rdzv-endpoint, so that no host is a single point of failure");
  std::string rdzv_conf;
  app.add_option("--rdzv-conf,--rdzv_conf", rdzv_conf,
                 "KEY=VALUE,... for a multi-node rendezvous, in seconds: join_timeout (600: how long to wait for MIN "
                 "nodes), last_call_timeout (2: how long to wait for more once MIN joined), timeout (60: each call to "
                 "the rendezvous store, and how long it may stay unreachable); read_timeout is an alias of timeout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tandem-run: error: %s (see --help)\n", e.what());
    return 2;
  }
  auto usage_error = [](const std::string& msg) {
    std::fprintf(stderr, "tandem-run: error: %s (see --help)\n", msg.c_str());
    return 2;
  };

  o.command = app.remaining();
  if (!o.command.empty() && o.command.front() == "--") o.command.erase(o.command.begin());
  if (o.command.empty()) return usage_error("no PROGRAM given: tandem-run [OPTIONS] PROGRAM [ARGS...]");
  if (!o.command.front().empty() && o.command.front()[0] == '-' && o.command.front() != "-")
    return usage_error("unknown option " + o.command.front());

  if (rdzv_backend == "etcd" || rdzv_backend == "etcd-v2") {
    o.rdzv_backend = "etcd";
    if (std::string err = parse_etcd_endpoints(rdzv_endpoint, o); !err.empty()) return usage_error(err);
  } else if (rdzv_backend != "c10d" && rdzv_backend != "static") {
    return usage_error("--rdzv-backend " + rdzv_backend +
                       ": expected c10d or static (a TCP store served by one agent), or etcd / etcd-v2");
  }
  if (!rdzv_endpoint.empty() && o.rdzv_backend != "etcd") {
    const size_t colon = rdzv_endpoint.rfind(':');
    o.master_addr = rdzv_endpoint.substr(0, colon);
    if (colon != std::string::npos) {
      try {
        size_t used = 0;
        o.master_port = std::stoi(rdzv_endpoint.substr(colon + 1), &used);
        if (used != rdzv_endpoint.size() - colon - 1 || o.master_port < 1 || o.master_port > 65535)
          throw std::invalid_argument(rdzv_endpoint);
      } catch (const std::exception&) {
        return usage_error("--rdzv-endpoint " + rdzv_endpoint + ": expected HOST[:PORT] with a port in 1-65535");
      }
    }
    if (o.master_addr.empty()) return usage_error("--rdzv-endpoint " + rdzv_endpoint + ": no host");
  }
  if (std::string err = parse_nproc(nproc, o); !err.empty()) return usage_error(err);
  if (std::string err = parse_nnodes(nnodes, o); !err.empty()) return usage_error(err);
  if (std::string err = parse_rdzv_conf(rdzv_conf, o); !err.empty()) return usage_error(err);
  if (o.standalone && o.nnodes != 1)
    return usage_error("--standalone runs on one node, but --nnodes is " + nnodes);
  o.node_rank_given = node_rank_opt->count() > 0;
  if (o.node_rank_given && o.min_nodes != o.nnodes)
    return usage_error("--node-rank with --nnodes " + nnodes +
                       ": an elastic job numbers its nodes by arrival; give one number of nodes, or no --node-rank");
  if (o.node_rank >= o.nnodes)
    return usage_error("--node-rank " + std::to_string(o.node_rank) + " must be smaller than --nnodes " +
                       std::to_string(o.nnodes));
  if (static_cast<long long>(o.nnodes) * o.nproc_per_node > (1 << 24))
    return usage_error("--nnodes x --nproc-per-node is implausibly large");
  return -1;
}

int visible_gpu_count() {
  int present = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++present;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!visible) return present;
  const std::string v = visible;
  if (v.empty() || v.rfind("-1", 0) == 0) return 0;
  int listed = 1;
  for (char c : v) listed += c == ',';
  return std::min(listed, present);
}

}  // namespace tandem::run
