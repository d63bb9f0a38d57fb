// train_gpt: a small GPT-style character language model (the models library's train/models/gpt.h) trained data-parallel with
// DistributedDataParallel over Gloo, built against the installed Tandem package only.
// Corpus: Debian's `fortunes` package (/usr/share/games/fortunes, installed by scripts/setup.sh),
// or --corpus FILE|DIR. 95% of the characters train, the last 5% validate.
// Recipe: AdamW (weight decay 0.1 on matrices only, betas 0.9/0.99), linear warm-up then cosine
// decay to a tenth, gradient clipping at norm 1, cross-entropy on next-character targets. Each rank
// draws its own random windows (seed + rank); DDP averages the gradients.
// Assumes: started by tandem-run (or torchrun), which sets RANK, WORLD_SIZE, MASTER_ADDR, ...;
// without RANK it trains alone. Prints (rank 0) the corpus's unigram entropy, the validation loss
// at each evaluation, the time, and samples text at the end.
// Guarantees: exit 0 only when the final validation loss is below --max-val-ratio times the
// unigram entropy (default 0.75; --smoke: 150 steps, a small model, and a ratio of 1.0, i.e. the
// model beats the best context-free guess); otherwise it says why and exits 1. --profile prints
// the per-op wall time of rank 0's training loop (core/profiler.h).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "train/models/char_corpus.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/profiler.h"
#include "core/random.h"
#include "core/thread_pool.h"
#include "dist/parallel/ddp.h"
#include "dist/store/env.h"
#include "dist/group/process_group_factory.h"
#include "dist/store/tcp_store.h"
#include "train/models/gpt.h"
#include "kernels/linear.h"
#include "optim/clip_grad.h"
#include "optim/optimizer.h"

using namespace tandem;

namespace {

struct Options {
  std::string corpus = "/usr/share/games/fortunes";
  int64_t steps = 1500, warmup = 100, batch = 16, eval_every = 250, eval_windows = 256, sample_chars = 300;
  double lr = 3e-3, max_val_ratio = 0.75;
  uint64_t seed = 1337;
  bool profile = false;
  gpt::Config model;
};

Options parse(int argc, char** argv) {
  Options o;
  o.model.block_size = 64, o.model.n_layer = 2, o.model.n_head = 4, o.model.n_embd = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      TANDEM_CHECK(i + 1 < argc, "train_gpt: ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--smoke") {
      o.steps = 150, o.warmup = 10, o.eval_every = 50, o.eval_windows = 32, o.sample_chars = 80;
      o.model.n_layer = 1, o.model.n_embd = 32, o.model.block_size = 32, o.max_val_ratio = 1.0;
    } else if (a == "--profile") o.profile = true;
    else if (a == "--corpus") o.corpus = value();
    else if (a == "--steps") o.steps = std::stoll(value());
    else if (a == "--warmup") o.warmup = std::stoll(value());
    else if (a == "--batch-size") o.batch = std::stoll(value());
    else if (a == "--eval-every") o.eval_every = std::stoll(value());
    else if (a == "--lr") o.lr = std::stod(value());
    else if (a == "--layers") o.model.n_layer = std::stoll(value());
    else if (a == "--heads") o.model.n_head = std::stoll(value());
    else if (a == "--dim") o.model.n_embd = std::stoll(value());
    else if (a == "--block-size") o.model.block_size = std::stoll(value());
    else if (a == "--seed") o.seed = std::stoull(value());
    else if (a == "--max-val-ratio") o.max_val_ratio = std::stod(value());
    else
      TANDEM_FAIL("train_gpt: unknown argument '", a,
                  "'; expected --smoke, --corpus, --steps, --warmup, --batch-size, --eval-every, --lr, --layers, "
                  "--heads, --dim, --block-size, --seed, --max-val-ratio, --profile");
  }
  TANDEM_CHECK(o.steps > 0 && o.batch > 0 && o.eval_every > 0 && o.warmup >= 0, "train_gpt: steps, batch size and "
               "eval interval must be positive");
  return o;
}

// Linear warm-up to lr, then cosine decay to lr / 10 at the last step.
double lr_at(const Options& o, int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  const double t = static_cast<double>(step - o.warmup) / static_cast<double>(std::max<int64_t>(1, o.steps - o.warmup));
  return o.lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, t))));
}

double evaluate(gpt::GPT& model, const gpt::CharCorpus& corpus, const Options& o) {
  NoGradGuard ng;
  model.eval();
  const std::vector<int64_t> starts = corpus.val_starts(o.model.block_size, o.eval_windows);
  double total = 0.0;
  int64_t n = 0;
  for (size_t i = 0; i < starts.size(); i += 32) {
    const std::vector<int64_t> part(starts.begin() + i, starts.begin() + std::min(starts.size(), i + 32));
    const auto b = corpus.window_batch(part, o.model.block_size);
    const Tensor logits = model.forward(b.x);
    const Tensor loss = F::cross_entropy(F::reshape(logits, {-1, corpus.vocab_size()}), F::reshape(b.y, {-1}),
                                         -100, 0.0, "sum");
    total += loss.item<double>();
    n += b.y.numel();
  }
  model.train();
  return total / static_cast<double>(n);
}

// Samples n characters after `prompt`, temperature 0.8, from the model's own predictions.
std::string sample(gpt::GPT& model, const gpt::CharCorpus& corpus, const std::string& prompt, int64_t n,
                   Generator& gen) {
  NoGradGuard ng;
  model.eval();
  std::vector<int64_t> ids;
  for (char ch : prompt)
    for (int64_t t = 0; t < corpus.vocab_size(); ++t)
      if (corpus.chars[t] == ch) ids.push_back(t);
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(ids.size()), model.config.block_size);
    const std::vector<int64_t> ctx(ids.end() - T, ids.end());
    const Tensor logits = model.forward(Tensor::from_vector(ctx, {1, T}));
    const Tensor last = F::select(F::select(logits, 0, 0), 0, T - 1);
    const std::vector<double> p = F::softmax(F::div(last, 0.8), 0).to_vector<double>();
    double u = gen.uniform(), acc = 0.0;
    int64_t next = static_cast<int64_t>(p.size()) - 1;
    for (size_t t = 0; t < p.size(); ++t) {
      acc += p[t];
      if (u < acc) {
        next = static_cast<int64_t>(t);
        break;
      }
    }
    ids.push_back(next);
    out.push_back(corpus.chars[next]);
  }
  model.train();
  return out;
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const bool launched = std::getenv("RANK") != nullptr;
  const dist::DistEnv env = launched ? dist::env_from_launcher("pytorch") : dist::DistEnv{};
  const dist::Millis timeout(120'000);
  const bool lead = env.rank == 0;

  const gpt::CharCorpus corpus(o.corpus, 0.05);
  const double entropy = corpus.unigram_entropy();
  gpt::Config cfg = o.model;
  cfg.vocab_size = corpus.vocab_size();
  if (lead) {
    std::printf("corpus %s: %zu files, %lld characters (%lld train, %lld validation), vocabulary %lld\n",
                o.corpus.c_str(), corpus.sources.size(), static_cast<long long>(corpus.tokens_size()),
                static_cast<long long>(corpus.split), static_cast<long long>(corpus.tokens_size() - corpus.split),
                static_cast<long long>(cfg.vocab_size));
    std::printf("unigram entropy %.4f nats/char (%.3f bits/char)\n", entropy, entropy / std::log(2.0));
  }

  manual_seed(o.seed);  // the same initial weights everywhere (DDP broadcasts rank 0's anyway)
  auto net = std::make_shared<gpt::GPT>(cfg);
  std::shared_ptr<dist::Store> store;
  std::shared_ptr<dist::ProcessGroup> group;
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (env.world_size > 1) {
    dist::TCPStoreOptions so;
    so.timeout = timeout;
    so.num_workers = env.world_size;
    store = std::make_shared<dist::TCPStore>(env.master_addr, env.master_port, env.rank == 0, so);
    group = dist::make_process_group("gloo", store, env.rank, env.world_size, timeout);
    ddp = std::make_unique<dist::DistributedDataParallel>(net, group);
  }
  nn::Module& model = ddp ? static_cast<nn::Module&>(*ddp) : *net;

  // Weight decay on matrices (dim >= 2) only, as nanoGPT.
  optim::ParamGroup decay{{}, o.lr, 0.1}, no_decay{{}, o.lr, 0.0};
  int64_t n_params = 0;
  for (const auto& [name, p] : net->named_parameters()) {
    (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
    n_params += p.numel();
  }
  optim::AdamW opt({decay, no_decay}, optim::AdamOptions{.lr = o.lr, .beta1 = 0.9, .beta2 = 0.99});
  if (lead)
    std::printf("model: %lld layers, %lld heads, dim %lld, block %lld, %lld parameters; %d rank(s) x batch %lld\n",
                static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_head),
                static_cast<long long>(cfg.n_embd), static_cast<long long>(cfg.block_size),
                static_cast<long long>(n_params), env.world_size, static_cast<long long>(o.batch));

  Generator data_gen(o.seed + 1 + static_cast<uint64_t>(env.rank));
  const double initial_val = evaluate(*net, corpus, o);
  if (lead) std::printf("step %5d val loss %.4f\n", 0, initial_val);
  const auto t0 = std::chrono::steady_clock::now();
  double val = initial_val, train_loss = 0.0;
  if (o.profile) profiler::set_enabled(true);
  for (int64_t step = 0; step < o.steps; ++step) {
    opt.set_lr(lr_at(o, step));
    const auto b = corpus.train_batch(o.batch, cfg.block_size, data_gen);
    const Tensor logits = model(b.x);
    const Tensor loss = F::cross_entropy(F::reshape(logits, {-1, cfg.vocab_size}), F::reshape(b.y, {-1}));
    opt.zero_grad();
    loss.backward();  // DDP: gradients averaged across ranks while backward runs
    optim::clip_grad_norm_(net->parameters(), 1.0);
    opt.step();
    train_loss = loss.item<double>();
    if ((step + 1) % o.eval_every == 0 || step + 1 == o.steps) {
      if (o.profile) profiler::set_enabled(false);  // the profile covers the training steps only
      val = evaluate(*net, corpus, o);
      if (o.profile) profiler::set_enabled(true);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (lead)
        std::printf("step %5lld train loss %.4f val loss %.4f lr %.2e %.1f s\n", static_cast<long long>(step + 1),
                    train_loss, val, opt.lr(), secs);
      std::fflush(stdout);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (o.profile) {
    profiler::set_enabled(false);
    if (lead)
      std::printf("profile (wall time per op, rank 0, training steps):\n%s\n",
                  profiler::report(kernels::measure_gemm_peak_gflops(num_threads())).c_str());
  }
  if (lead) {
    std::printf("final val loss %.4f nats/char = %.3f x unigram entropy %.4f; %lld steps in %.1f s (%.1f ms/step)\n",
                val, val / entropy, entropy, static_cast<long long>(o.steps), secs, 1e3 * secs / o.steps);
    Generator sample_gen(o.seed);
    std::printf("--- sample ---\n%s\n--- end of sample ---\n",
                sample(*net, corpus, "\n", o.sample_chars, sample_gen).c_str());
  }
  if (group) group->barrier()->wait(timeout);  // rank 0 serves the store: leave together
  if (!(val < o.max_val_ratio * entropy)) {
    std::printf("rank %d: validation loss %.4f is not below %.2f x the unigram entropy %.4f\n", env.rank, val,
                o.max_val_ratio, entropy);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // tandem::Error says what was wrong and what was expected
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
  }
  return 1;
}
