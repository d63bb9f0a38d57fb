// model_steps: the training step of the two example models (train/models/resnet.h and
// train/models/gpt.h of the models library, the very headers the examples build) timed on synthetic data, for
// bench/compare_models.py, which runs bench/pytorch_models.py with the same flags for PyTorch.
// Owns: the recipes of the examples' training loops, without their data pipelines, DDP and
// evaluations:
//   resnet: ResNet(width, blocks), images N(0, 1) [batch, 1, 28, 28], labels uniform in [0, 10),
//           log_softmax + nll_loss, SGD lr 0.1, momentum 0.9, Nesterov, weight decay 5e-4;
//   gpt:    GPT(vocabulary 99, block 64, 2 layers, 4 heads, dim 64), token windows uniform in
//           [0, vocab) [batch, block], cross-entropy on the next token, AdamW lr 3e-3, betas
//           0.9/0.99, weight decay 0.1 on matrices only, gradient clipping at norm 1.
// A step is zero_grad, forward, loss, backward, (clip,) optimizer step, loss.item(); the batches
// are made before the clock starts (a pool of 8, cycled), so only the training loop is timed.
// Guarantees: --warmup steps run first and are not timed; then --iters steps are timed as one
// interval; one JSON line goes to --metrics-out (or stdout):
//   {"type":"bench","model":..,"threads":..,"batch_size":..,"iters":..,"seconds":..,
//    "samples_per_s":..,"tokens_per_s":..(gpt),"first_loss":..,"last_loss":..,"params":..,
//    "fused_attention":"on"|"off"(gpt)}
// --profile prints the per-op table of core/profiler.h over the timed steps.
// Usage: model_steps --model resnet|gpt [--iters N] [--warmup N] [--batch-size N] [--threads N]
//        [--width W] [--blocks B] [--layers L] [--heads H] [--dim D] [--block-size T] [--vocab V]
//        [--seed S] [--metrics-out FILE] [--profile] [--fused-attention on|off] [--device cpu|cuda[:N]]
//        [--amp off|bf16|fp16]
// --amp: the forward runs under autocast (nn/amp.h, as the trainer's --amp), the weights and the optimizer stay
// float32; fp16 scales the loss with a GradScaler (the GPT unscales before clipping), as PyTorch's recipe does.
// --device: the model and the pool of batches are moved there before the clock starts; each step's
// loss.item() waits for the device, so the timed interval covers the device's work.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/profiler.h"
#include "core/random.h"
#include "core/thread_pool.h"
#include "kernels/linear.h"
#include "nn/amp.h"
#include "nn/attention.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "train/models/gpt.h"
#include "train/models/resnet.h"

using namespace tandem;

namespace {

struct Options {
  std::string model, metrics_out;
  int64_t iters = 30, warmup = 5, batch = 0, width = 8, blocks = 3, layers = 2, heads = 4, dim = 64, block = 64;
  int64_t vocab = 99;
  int threads = 1;
  uint64_t seed = 1;
  bool profile = false;
  std::string fused_attention = "on";
  std::string device = "cpu";
  std::string amp = "off";
};

struct Batch {
  Tensor x, y;
};

// One training step of a recipe: returns the loss.
struct Recipe {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::Optimizer> opt;
  std::shared_ptr<optim::GradScaler> scaler;  // enabled for --amp fp16 only
  std::vector<Batch> batches;
  std::function<double(const Batch&)> step;
};

// fp16 scales the loss (PyTorch's GradScaler defaults); otherwise a disabled scaler, whose calls are plain
// backward and step.
std::shared_ptr<optim::GradScaler> make_scaler(amp::Precision p) {
  optim::GradScalerOptions so;
  so.enabled = p == amp::Precision::kFloat16;
  return std::make_shared<optim::GradScaler>(so);
}

Recipe resnet_recipe(const Options& o, std::mt19937& rng, Device device) {
  Recipe r;
  auto net = std::make_shared<resnet::ResNet>(o.width, o.blocks);
  net->to(device);
  r.model = net;
  r.opt = std::make_unique<optim::SGD>(
      net->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  std::normal_distribution<float> pixel;
  std::uniform_int_distribution<int64_t> label(0, 9);
  for (int i = 0; i < 8; ++i) {
    std::vector<float> x(static_cast<size_t>(o.batch * 28 * 28));
    std::vector<int64_t> y(static_cast<size_t>(o.batch));
    for (float& v : x) v = pixel(rng);
    for (int64_t& v : y) v = label(rng);
    r.batches.push_back({Tensor::from_vector(x, {o.batch, 1, 28, 28}).to(device), Tensor::from_vector(y, {o.batch}).to(device)});
  }
  optim::Optimizer* opt = r.opt.get();
  const amp::Precision p = amp::parse_precision(o.amp);
  auto scaler = r.scaler = make_scaler(p);
  r.step = [net, opt, p, scaler](const Batch& b) {
    opt->zero_grad();
    Tensor loss;
    {
      amp::AutocastGuard autocast(p);
      loss = F::nll_loss(net->forward(b.x), b.y);
    }
    scaler->scale(loss).backward();
    scaler->step(*opt);
    scaler->update();
    return loss.item<double>();
  };
  return r;
}

Recipe gpt_recipe(const Options& o, std::mt19937& rng, Device device) {
  Recipe r;
  gpt::Config c;
  c.vocab_size = o.vocab, c.block_size = o.block, c.n_layer = o.layers, c.n_head = o.heads, c.n_embd = o.dim;
  auto net = std::make_shared<gpt::GPT>(c);
  net->to(device);
  r.model = net;
  optim::ParamGroup decay{{}, 3e-3, 0.1}, no_decay{{}, 3e-3, 0.0};
  for (const auto& [name, p] : net->named_parameters()) (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  r.opt = std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{decay, no_decay},
                                         optim::AdamOptions{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.99});
  std::uniform_int_distribution<int64_t> token(0, o.vocab - 1);
  for (int i = 0; i < 8; ++i) {  // y is x shifted by one, as windows of a text
    std::vector<int64_t> seq(static_cast<size_t>(o.batch * (o.block + 1)));
    for (int64_t& v : seq) v = token(rng);
    std::vector<int64_t> x, y;
    for (int64_t b = 0; b < o.batch; ++b) {
      const auto* s = seq.data() + b * (o.block + 1);
      x.insert(x.end(), s, s + o.block);
      y.insert(y.end(), s + 1, s + o.block + 1);
    }
    r.batches.push_back(
        {Tensor::from_vector(x, {o.batch, o.block}).to(device), Tensor::from_vector(y, {o.batch, o.block}).to(device)});
  }
  optim::Optimizer* opt = r.opt.get();
  const int64_t vocab = o.vocab;
  const amp::Precision p = amp::parse_precision(o.amp);
  auto scaler = r.scaler = make_scaler(p);
  r.step = [net, opt, vocab, p, scaler](const Batch& b) {
    Tensor loss;
    {
      amp::AutocastGuard autocast(p);
      const Tensor logits = net->forward(b.x);
      loss = F::cross_entropy(F::reshape(logits, {-1, vocab}), F::reshape(b.y, {-1}));
    }
    opt->zero_grad();
    scaler->scale(loss).backward();
    scaler->unscale(*opt);
    optim::clip_grad_norm_(net->parameters(), 1.0);
    scaler->step(*opt);
    scaler->update();
    return loss.item<double>();
  };
  return r;
}

int run(const Options& o) {
  set_num_threads(o.threads);
  nn::functional::set_fused_attention(o.fused_attention == "on");
  manual_seed(o.seed);
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  const Device device = Device::parse(o.device);
  Recipe r = o.model == "resnet" ? resnet_recipe(o, rng, device) : gpt_recipe(o, rng, device);
  int64_t params = 0;
  for (const Tensor& p : r.model->parameters()) params += p.numel();
  double first = 0, last = 0;
  for (int64_t i = 0; i < o.warmup; ++i) first = r.step(r.batches[i % r.batches.size()]);
  if (o.profile) profiler::set_enabled(true);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.iters; ++i) {
    last = r.step(r.batches[(o.warmup + i) % r.batches.size()]);
    if (i == 0 && o.warmup == 0) first = last;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (o.profile) {
    profiler::set_enabled(false);
    std::printf("profile (wall time per op over %lld timed steps):\n%s\n", static_cast<long long>(o.iters),
                kernels::profile_report(device, o.threads).c_str());
  }
  const double samples = static_cast<double>(o.batch * o.iters);
  nlohmann::json j = {{"type", "bench"},        {"model", o.model},        {"threads", o.threads},
                      {"batch_size", o.batch},  {"iters", o.iters},        {"warmup", o.warmup},
                      {"seconds", seconds},     {"samples_per_s", samples / seconds},
                      {"first_loss", first},    {"last_loss", last},       {"params", params},
                      {"device", o.device},     {"amp", o.amp}};
  if (o.model == "gpt") j["fused_attention"] = o.fused_attention;
  if (o.model == "gpt") j["tokens_per_s"] = samples * static_cast<double>(o.block) / seconds;
  if (o.metrics_out.empty()) {
    std::cout << j.dump() << "\n";
  } else {
    std::ofstream f(o.metrics_out, std::ios::app);
    f << j.dump() << "\n";
    if (!f) {
      std::fprintf(stderr, "model_steps: cannot write --metrics-out %s\n", o.metrics_out.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Times the training step of the example ResNet or GPT on synthetic data"};
  const auto positive = CLI::Range(int64_t{1}, int64_t{1} << 30), non_negative = CLI::Range(int64_t{0}, int64_t{1} << 30);
  app.add_option("--model", o.model, "resnet or gpt")->required()->check(CLI::IsMember({"resnet", "gpt"}));
  app.add_option("--iters", o.iters, "timed steps")->check(positive);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(non_negative);
  app.add_option("--batch-size", o.batch, "samples a step (default: resnet 64, gpt 16)")->check(positive);
  app.add_option("--threads", o.threads, "kernel threads")->check(CLI::Range(1, 1024));
  app.add_option("--width", o.width, "resnet: channels of stage 1")->check(positive);
  app.add_option("--blocks", o.blocks, "resnet: blocks per stage")->check(positive);
  app.add_option("--layers", o.layers, "gpt: blocks")->check(positive);
  app.add_option("--heads", o.heads, "gpt: attention heads")->check(positive);
  app.add_option("--dim", o.dim, "gpt: embedding width")->check(positive);
  app.add_option("--block-size", o.block, "gpt: context length")->check(positive);
  app.add_option("--vocab", o.vocab, "gpt: vocabulary size")->check(positive);
  app.add_option("--seed", o.seed, "weights and synthetic data");
  app.add_option("--metrics-out", o.metrics_out, "append the JSON line here instead of stdout");
  app.add_option("--fused-attention", o.fused_attention,
                 "gpt: on: attention runs as the fused CPU kernel (nn/attention.h); off: composed of matmul and "
                 "softmax")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--device", o.device, "cpu (default), cuda or cuda:N");
  app.add_flag("--profile", o.profile, "per-op wall time over the timed steps");
  app.add_option("--amp", o.amp, "off (default), bf16 or fp16: the forward under autocast, as the trainer's --amp")
      ->check(CLI::IsMember({"off", "bf16", "fp16"}));
  CLI11_PARSE(app, argc, argv);
  if (o.batch == 0) o.batch = o.model == "resnet" ? 64 : 16;
  if (o.model == "gpt" && o.dim % o.heads != 0) {
    std::fprintf(stderr, "model_steps: --dim %lld must be a multiple of --heads %lld\n",
                 static_cast<long long>(o.dim), static_cast<long long>(o.heads));
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_steps: %s\n", e.what());
    return 1;
  }
}
