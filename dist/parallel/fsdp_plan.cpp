// FSDP's units: which subtrees of a module the auto-wrap policy makes into units (see fsdp.h).
#include <cxxabi.h>

#include <cstdlib>
#include <map>
#include <set>
#include <typeinfo>

#include "core/error.h"
#include "dist/parallel/fsdp.h"

namespace tandem::dist {

std::string module_class_name(const nn::Module& m) {
  const char* mangled = typeid(m).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  const size_t angle = name.find('<');
  if (angle != std::string::npos) name.resize(angle);
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

namespace {

std::string join(const std::string& path, const std::string& name) { return path.empty() ? name : path + "." + name; }

struct Planner {
  const AutoWrapPolicy& policy;
  const std::set<std::string>& full_precision;
  std::map<const TensorImpl*, int> uses;  // how many names each parameter has in the whole module
  std::set<const TensorImpl*> taken;
  std::set<std::string> classes_seen;
  std::vector<UnitPlan> out;

  // The parameters of `m`'s subtree no unit has taken yet (first name of each), in m's order.
  std::vector<std::pair<std::string, Tensor>> remaining(const nn::Module& m, const std::string& path,
                                                        bool include_shared) const {
    std::vector<std::pair<std::string, Tensor>> left;
    std::set<const TensorImpl*> listed;
    for (auto& [name, t] : m.named_parameters()) {
      const TensorImpl* id = t.impl_ptr().get();
      if (taken.count(id) || listed.count(id)) continue;
      if (!include_shared && uses.at(id) > 1) continue;
      listed.insert(id);
      left.emplace_back(join(path, name), t);
    }
    return left;
  }

  void take(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& params,
            bool keep_precision = false) {
    UnitPlan u{path, {}, keep_precision};
    for (auto& [name, t] : params) {
      u.params.push_back(name);
      taken.insert(t.impl_ptr().get());
    }
    out.push_back(std::move(u));
  }

  void visit(const nn::Module& m, const std::string& path, bool root) {
    classes_seen.insert(module_class_name(m));
    for (auto& [name, child] : m.children()) visit(*child, join(path, name), false);
    if (root) {
      const auto left = remaining(m, path, /*include_shared=*/true);
      if (!left.empty()) take("", left);
      return;
    }
    const auto left = remaining(m, path, /*include_shared=*/false);
    if (left.empty()) return;
    int64_t numel = 0;
    for (auto& [name, t] : left) numel += t.numel();
    if (full_precision.count(module_class_name(m))) return take(path, left, /*keep_precision=*/true);
    const bool by_class = policy.module_classes.count(module_class_name(m)) > 0;
    const bool by_size = policy.min_num_params > 0 && numel >= policy.min_num_params;
    if (by_class || by_size) take(path, left);
  }
};

}  // namespace

std::vector<UnitPlan> plan_units(const nn::Module& module, const AutoWrapPolicy& policy,
                                 const std::set<std::string>& full_precision_classes) {
  TANDEM_CHECK(policy.min_num_params >= 0, "FullyShardedDataParallel: auto_wrap_policy min_num_params is ",
               policy.min_num_params, ", expected >= 0 (0: no size rule)");
  Planner p{policy, full_precision_classes, {}, {}, {}, {}};
  for (auto& [name, t] : module.named_parameters()) ++p.uses[t.impl_ptr().get()];
  p.visit(module, "", true);
  for (const std::string& cls : policy.module_classes) {
    if (p.classes_seen.count(cls)) continue;
    std::string seen;
    for (const std::string& c : p.classes_seen) seen += (seen.empty() ? "" : ", ") + c;
    TANDEM_FAIL("FullyShardedDataParallel: auto_wrap_policy names module class '", cls,
                "', which no module of the model has (its classes: ", seen, ")");
  }
  return p.out;
}

}  // namespace tandem::dist
