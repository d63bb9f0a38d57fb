// The Runner's parameter schedulers (see param_scheduler.h): MMEngine's _ParamScheduler step (the
// active range [begin, end), last_step counted from begin) and each type's chainable value, in the
// same arithmetic order as MMEngine's and PyTorch's, so that the lrs agree to the last bit or so.
#include "train/param_scheduler.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

namespace tandem::train {
namespace {

using State = std::map<std::string, double>;

struct Range {
  bool by_epoch = true;
  int64_t begin = 0, end = 0;
  int64_t scale = 1;  // what periods given in epochs are multiplied by (iterations per epoch when converted)
  // A resume must keep `end`: it was given, or the type's values depend on it.
  bool end_fixed = false;
};

constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

// The common keyword arguments of every type's schema (MMEngine's _ParamScheduler).
Schema common_schema() {
  return {arg_bool("by_epoch", true, "step per epoch (false: per iteration)"),
          at_least(arg_int("begin", 0, "first step the scheduler acts at"), 0),
          nullable(arg_of("end", ArgKind::Int, "", "step it stops at (absent: the end of the run)")),
          arg_bool("convert_to_iter_based", false, "epochs converted into iterations (needs by_epoch true)")};
}

Schema with_common(Schema own) {
  Schema s = common_schema();
  s.insert(s.end(), own.begin(), own.end());
  return s;
}

// The range of `k` (checked against the type's schema: each key's kind and range; here the checks
// across keys). An absent end is MMEngine's Runner's: the end of the run, in the scheduler's unit,
// where the type's values depend on it (`values_need_end`); elsewhere it is unbounded, which inside
// one run is the same, and lets a run resumed with a larger max_epochs step where the uninterrupted
// run did.
Range read_range(const ScheduleContext& c, const Kwargs& k, bool values_need_end = false) {
  Range r;
  const bool by_epoch = k.boolean("by_epoch");
  const bool convert = k.boolean("convert_to_iter_based");
  TANDEM_CHECK(!convert || by_epoch, k.label("convert_to_iter_based"),
               " needs by_epoch true (it converts epochs into iterations), got by_epoch false");
  r.begin = k.integer("begin");
  const int64_t run_end = by_epoch ? c.max_epochs : c.max_epochs * c.iters_per_epoch;
  r.end = k.given("end") ? k.integer("end") : values_need_end ? run_end : kUnbounded;
  TANDEM_CHECK(r.end > r.begin, k.label("end"), " must be > begin (", r.begin, "), got ", r.end);
  r.end_fixed = k.given("end") || values_need_end;
  if (convert) {
    TANDEM_CHECK(c.iters_per_epoch >= 1, k.label("convert_to_iter_based"), " needs the iterations per epoch, got ",
                 c.iters_per_epoch);
    r.scale = c.iters_per_epoch;
    r.begin *= r.scale;
    if (r.end != kUnbounded) r.end *= r.scale;
  }
  r.by_epoch = by_epoch && !convert;
  return r;
}

double state_at(const State& s, const std::string& key, const std::string& who) {
  auto it = s.find(key);
  TANDEM_CHECK(it != s.end(), who, ": the saved schedule state has no '", key, "'");
  return it->second;
}

// A type's chainable value: the lr of a group for its step `last` (>= 0) from the lr it has now
// (`base`: the group's initial lr).
using Rule = std::function<double(int64_t last, double base, double lr)>;

// MMEngine's _ParamScheduler over the lr of every param group; `constants` are the type's settings
// (saved, and checked on load).
class LrScheduler : public ParamScheduler {
 public:
  LrScheduler(const ScheduleContext& c, std::string type, Range r, State constants, Rule rule)
      : opt_(*c.optimizer), type_(std::move(type)), r_(r), base_(c.initial_lrs), settings_(std::move(constants)),
        rule_(std::move(rule)) {
    if (base_.empty())
      for (const auto& g : opt_.param_groups()) base_.push_back(g.lr);
    TANDEM_CHECK(base_.size() == opt_.param_groups().size(), type_, ": ", base_.size(), " initial lrs for ",
                 opt_.param_groups().size(), " param groups");
    settings_["begin"] = static_cast<double>(r_.begin);
    if (r_.end_fixed) settings_["end"] = static_cast<double>(r_.end);
    settings_["by_epoch"] = r_.by_epoch ? 1.0 : 0.0;
  }
  bool by_epoch() const override { return r_.by_epoch; }
  void step() override {
    if (r_.begin <= global_ && global_ < r_.end) {
      ++last_;
      auto& groups = opt_.param_groups();
      for (size_t g = 0; g < groups.size(); ++g) groups[g].lr = rule_(last_, base_[g], groups[g].lr);
    }
    ++global_;
  }
  State state_dict() const override {
    State out = settings_;
    out["last_step"] = static_cast<double>(last_);
    out["global_step"] = static_cast<double>(global_);
    for (size_t g = 0; g < base_.size(); ++g) out["base_lr." + std::to_string(g)] = base_[g];
    return out;
  }
  // The counters (and the initial lrs) only: the lr itself comes back with the optimizer's state.
  void load_state_dict(const State& s) override {
    for (const auto& [key, mine] : settings_) {
      const double saved = state_at(s, key, type_);
      TANDEM_CHECK(saved == mine, type_, ": the saved schedule has ", key, " = ", saved, " but this one has ", mine,
                   "; resume with the checkpoint's param_scheduler");
    }
    last_ = static_cast<int64_t>(state_at(s, "last_step", type_));
    global_ = static_cast<int64_t>(state_at(s, "global_step", type_));
    for (size_t g = 0; g < base_.size(); ++g) base_[g] = state_at(s, "base_lr." + std::to_string(g), type_);
  }

 private:
  optim::Optimizer& opt_;
  std::string type_;
  Range r_;
  std::vector<double> base_;
  State settings_;
  Rule rule_;
  int64_t last_ = -1, global_ = 0;
};

// Builds a scheduler and applies its first value (MMEngine's constructor step).
std::unique_ptr<ParamScheduler> started(const ScheduleContext& c, const char* type, const Range& r, State constants,
                                        Rule rule) {
  auto s = std::make_unique<LrScheduler>(c, type, r, std::move(constants), std::move(rule));
  s->step();
  return s;
}

std::vector<int64_t> milestones_of(const Kwargs& k) {
  const nlohmann::json v = nlohmann::json::parse(k.items().at("milestones"), nullptr, false);
  std::vector<int64_t> out;
  for (const auto& m : v) {
    TANDEM_CHECK(m.is_number_integer() && m.get<int64_t>() >= 0, k.label("milestones"),
                 " must be a list of integers >= 0, got ", k.items().at("milestones"));
    out.push_back(m.get<int64_t>());
  }
  return out;
}

}  // namespace

void SchedulerList::step_iter() {
  for (auto& s : items_)
    if (!s->by_epoch()) s->step();
}

void SchedulerList::step_epoch() {
  for (auto& s : items_)
    if (s->by_epoch()) s->step();
}

std::map<std::string, double> SchedulerList::state_dict() const {
  State out;
  for (size_t i = 0; i < items_.size(); ++i)
    for (const auto& [k, v] : items_[i]->state_dict()) out[std::to_string(i) + "." + k] = v;
  return out;
}

void SchedulerList::load_state_dict(const std::map<std::string, double>& state) {
  std::vector<State> parts(items_.size());
  std::set<std::string> surplus;
  for (const auto& [k, v] : state) {
    const size_t dot = k.find('.');
    const std::string index = k.substr(0, dot);
    const bool numeric = dot != std::string::npos && !index.empty() &&
                         index.find_first_not_of("0123456789") == std::string::npos;
    const size_t i = numeric ? std::stoul(index) : items_.size();
    if (i < items_.size())
      parts[i][k.substr(dot + 1)] = v;
    else
      surplus.insert(numeric ? index : k);
  }
  TANDEM_CHECK(surplus.empty(), "the saved schedule has state for scheduler '", *surplus.begin(),
               "' but this run has ", items_.size(), " scheduler(s); resume with the checkpoint's param_scheduler");
  for (size_t i = 0; i < items_.size(); ++i) items_[i]->load_state_dict(parts[i]);
}

namespace {

// Each factory is given its keywords checked against its schema (below), defaults filled in.
std::unique_ptr<ParamScheduler> make_step_lr(const ScheduleContext& c, const Kwargs& k) {
  const Range r = read_range(c, k);
  const double gamma = k.number("gamma");
  const int64_t every = k.integer("step_size") * r.scale;
  return started(c, "StepLR", r, {{"step_size", static_cast<double>(every)}, {"gamma", gamma}},
                 [=](int64_t last, double, double lr) { return last == 0 || last % every != 0 ? lr : lr * gamma; });
}

std::unique_ptr<ParamScheduler> make_multi_step_lr(const ScheduleContext& c, const Kwargs& k) {
  const Range r = read_range(c, k);
  std::vector<int64_t> milestones = milestones_of(k);
  for (int64_t& m : milestones) m *= r.scale;
  const double gamma = k.number("gamma");
  State constants{{"gamma", gamma}, {"milestones", static_cast<double>(milestones.size())}};
  for (size_t i = 0; i < milestones.size(); ++i)
    constants["milestone." + std::to_string(i)] = static_cast<double>(milestones[i]);
  return started(c, "MultiStepLR", r, std::move(constants), [=](int64_t last, double, double lr) {
    const auto hits = std::count(milestones.begin(), milestones.end(), last);  // Counter(milestones)[last]
    return hits == 0 ? lr : lr * std::pow(gamma, static_cast<double>(hits));
  });
}

std::unique_ptr<ParamScheduler> make_linear_lr(const ScheduleContext& c, const Kwargs& k) {
  const Range r = read_range(c, k, /*values_need_end=*/true);
  const double start = k.number("start_factor"), end = k.number("end_factor");
  const double total = static_cast<double>(r.end - r.begin - 1);
  return started(c, "LinearLR", r, {{"start_factor", start}, {"end_factor", end}}, [=](int64_t last, double, double lr) {
    if (last == 0) return lr * start;
    return lr * (1. + (end - start) / (total * start + static_cast<double>(last - 1) * (end - start)));
  });
}

std::unique_ptr<ParamScheduler> make_constant_lr(const ScheduleContext& c, const Kwargs& k) {
  const Range r = read_range(c, k, /*values_need_end=*/true);
  const double factor = k.number("factor");
  const int64_t last_held = r.end - r.begin - 1;  // its step that restores the lr
  return started(c, "ConstantLR", r, {{"factor", factor}}, [=](int64_t last, double, double lr) {
    if (last == 0) return lr * factor;
    return last != last_held ? lr : lr * (1.0 / factor);
  });
}

std::unique_ptr<ParamScheduler> make_exponential_lr(const ScheduleContext& c, const Kwargs& k) {
  const Range r = read_range(c, k);
  const double gamma = k.number("gamma");
  // MMEngine's build_iter_from_epoch: the same decay per epoch, spread over its iterations.
  const double per_step = r.scale > 1 ? std::pow(gamma, 1.0 / static_cast<double>(r.scale)) : gamma;
  return started(c, "ExponentialLR", r, {{"gamma", per_step}},
                 [=](int64_t last, double, double lr) { return last == 0 ? lr : lr * per_step; });
}

std::unique_ptr<ParamScheduler> make_cosine_lr(const ScheduleContext& c, const Kwargs& k) {
  // Without T_max the period is the range, so the values depend on its end.
  const Range r = read_range(c, k, /*values_need_end=*/!k.given("T_max"));
  TANDEM_CHECK(!(k.given("eta_min") && k.given("eta_min_ratio")), k.owner(),
               ": give eta_min or eta_min_ratio, not both");
  const int64_t t_max = k.given("T_max") ? k.integer("T_max") * r.scale : r.end - r.begin;
  const double ratio = k.given("eta_min_ratio") ? k.number("eta_min_ratio") : -1.0;
  const double eta_min = k.given("eta_min") ? k.number("eta_min") : 0.0, t = static_cast<double>(t_max);
  return started(c, "CosineAnnealingLR", r, {{"T_max", t}, {"eta_min", eta_min}, {"eta_min_ratio", ratio}},
                 [=](int64_t last, double base, double lr) {
                   const double floor = ratio < 0 ? eta_min : base * ratio, s = static_cast<double>(last);
                   if (last == 0) return lr;
                   if ((last - 1 - t_max) % (2 * t_max) == 0) return lr + (base - floor) * (1 - std::cos(M_PI / t)) / 2;
                   return (1 + std::cos(M_PI * s / t)) / (1 + std::cos(M_PI * (s - 1) / t)) * (lr - floor) + floor;
                 });
}

ArgSpec gamma_arg(const std::string& doc) { return above(arg_number("gamma", 0.1, doc), 0); }
ArgSpec factor_arg(const std::string& key, double def, bool zero_ok, const std::string& doc) {
  ArgSpec a = between(arg_number(key, def, doc), 0, 1);
  return zero_ok ? a : above(a, 0);
}

}  // namespace

void register_lr_schedulers(Registry<SchedulerFactory>& reg) {
  reg.register_module("StepLR", make_step_lr,
                      with_common({at_least(arg_int("step_size", 1, "steps between decays"), 1),
                                   gamma_arg("the lr's factor at each decay")}));
  reg.register_module("MultiStepLR", make_multi_step_lr,
                      with_common({required(arg_of("milestones", ArgKind::List, "", "steps to decay at, e.g. [8, 11]")),
                                   gamma_arg("the lr's factor at each milestone")}));
  reg.register_module("LinearLR", make_linear_lr,
                      with_common({factor_arg("start_factor", 1.0 / 3, false, "the lr's factor at begin"),
                                   factor_arg("end_factor", 1.0, true, "the lr's factor at end")}));
  reg.register_module("ConstantLR", make_constant_lr,
                      with_common({factor_arg("factor", 1.0 / 3, false, "the lr's factor until end")}));
  reg.register_module("ExponentialLR", make_exponential_lr,
                      with_common({required(gamma_arg("the lr's factor per step"))}));
  reg.register_module(
      "CosineAnnealingLR", make_cosine_lr,
      with_common({nullable(at_least(arg_of("T_max", ArgKind::Int, "", "the period (absent: end - begin)"), 1)),
                   nullable(arg_of("eta_min", ArgKind::Number, "", "the lowest lr (absent: 0)")),
                   nullable(at_least(arg_of("eta_min_ratio", ArgKind::Number, "", "the lowest lr as a ratio of the initial lr"), 0))}));
}

}  // namespace tandem::train
