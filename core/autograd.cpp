#include "core/autograd.h"

#include <atomic>
#include <queue>
#include <unordered_map>

#include "core/profiler.h"

namespace tandem {
namespace {
std::atomic<uint64_t> next_sequence_nr{0};
thread_local bool grad_enabled = true;
thread_local uint64_t recorded = 0;  // record() calls on this thread
// Callbacks of the backward running on this thread (null outside one).
thread_local std::vector<std::function<void()>>* current_callbacks = nullptr;
}  // namespace

Node::Node() : sequence_nr_(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}
Node::Node(LeafAccumulator)
    : sequence_nr_((uint64_t{1} << 63) + next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

bool GradMode::enabled() { return grad_enabled; }
void GradMode::set_enabled(bool enabled) { grad_enabled = enabled; }

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  auto impl = leaf_.lock();
  if (!impl || grads.empty() || !grads[0].defined()) return {};
  Tensor leaf(impl);
  Tensor g = leaf.grad();
  if (!g.defined()) {
    // Take ownership of the incoming buffer when nobody else can see it.
    leaf.set_grad(grads[0].storage().use_count() == 1 && grads[0].is_contiguous()
                      ? grads[0].detach()
                      : grads[0].clone());
  } else {
    g.add_(grads[0]);
  }
  // A copy: a hook may remove hooks (a reducer destroyed from inside one).
  const auto hooks = impl->autograd->post_accumulate_hooks;
  for (const auto& [handle, hook] : hooks) hook(leaf);
  return {};
}

namespace autograd {

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (auto fn = t.grad_fn()) return {fn, t.output_nr()};
  auto& meta = const_cast<Tensor&>(t).autograd_meta();
  if (!meta.grad_accumulator)
    meta.grad_accumulator = std::make_shared<AccumulateGrad>(std::weak_ptr<TensorImpl>(t.impl_ptr()));
  return {meta.grad_accumulator, 0};
}

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record(const std::shared_ptr<Node>& fn, std::initializer_list<Tensor> inputs,
            std::initializer_list<Tensor*> outputs) {
  fn->next_edges.clear();
  for (const Tensor& t : inputs) fn->next_edges.push_back(gradient_edge(t));
  uint32_t nr = 0;
  for (Tensor* out : outputs) out->set_grad_fn(fn, nr++);
  ++recorded;
}

uint64_t recorded_ops() { return recorded; }

void queue_callback(std::function<void()> fn) {
  TANDEM_CHECK(current_callbacks != nullptr, "queue_callback: no backward is running on this thread");
  current_callbacks->push_back(std::move(fn));
}

namespace {
void run_graph(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads);
}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  TANDEM_CHECK(current_callbacks == nullptr, "backward: re-entrant backward on the same thread is not supported");
  std::vector<std::function<void()>> callbacks;
  struct Scope {
    explicit Scope(std::vector<std::function<void()>>* c) { current_callbacks = c; }
    ~Scope() { current_callbacks = nullptr; }
  } scope(&callbacks);
  const profiler::BackwardPhase backward_phase;  // ops below count as backward in the profiler
  run_graph(roots, grads);
  // Callbacks may queue more callbacks; run until none are left.
  for (size_t i = 0; i < callbacks.size(); ++i) {
    auto fn = std::move(callbacks[i]);
    fn();
  }
}

namespace {
void run_graph(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  TANDEM_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ", grads.size(),
               " gradients");
  // Dependencies: how many edges point at each node from within the graph.
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::vector<Node*> stack;
  std::vector<std::shared_ptr<Node>> keep;  // roots' nodes stay alive
  auto visit = [&](const std::shared_ptr<Node>& n) {
    if (deps.emplace(n.get(), 0).second) stack.push_back(n.get());
  };

  struct Root {
    Edge edge;
    Tensor grad;
  };
  std::vector<Root> root_edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    TANDEM_CHECK(r.requires_grad(), "backward: tensor ", r.str(),
                 " does not require grad and has no grad_fn");
    Tensor g = grads[i];
    if (!g.defined()) {
      TANDEM_CHECK(r.numel() == 1, "backward: a gradient is needed for non-scalar ", r.str());
      g = Tensor::ones(r.shape(), r.dtype(), r.device());
    }
    TANDEM_CHECK(g.shape() == r.shape(), "backward: gradient ", g.str(), " for ", r.str());
    Edge e = gradient_edge(r);
    keep.push_back(e.fn);
    visit(e.fn);
    root_edges.push_back({e, g});
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      visit(e.fn);
      ++deps[e.fn.get()];
    }
  }

  auto deposit = [&](Node* n, uint32_t input_nr, Tensor g) {
    auto& buf = buffers[n];
    if (buf.size() <= input_nr) buf.resize(input_nr + 1);
    if (!buf[input_nr].defined()) {
      buf[input_nr] = std::move(g);
    } else {
      // Never write into a gradient another node may still hold.
      Tensor sum = buf[input_nr].clone();
      sum.add_(g);
      buf[input_nr] = std::move(sum);
    }
  };

  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr() < b->sequence_nr();
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(later_first)>
      ready(later_first);
  for (auto& r : root_edges) deposit(r.edge.fn.get(), r.edge.input_nr, r.grad);
  for (auto& r : root_edges)
    if (deps[r.edge.fn.get()] == 0) {
      deps[r.edge.fn.get()] = -1;  // queued
      ready.push(r.edge.fn);
    }

  while (!ready.empty()) {
    std::shared_ptr<Node> n = ready.top();
    ready.pop();
    std::vector<Tensor> in = std::move(buffers[n.get()]);
    buffers.erase(n.get());
    in.resize(n->num_outputs());
    std::vector<Tensor> out = n->apply(std::move(in));
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.valid()) continue;
      if (i < out.size() && out[i].defined()) deposit(e.fn.get(), e.input_nr, std::move(out[i]));
      if (--deps[e.fn.get()] == 0) {
        deps[e.fn.get()] = -1;
        ready.push(e.fn);
      }
    }
  }
}

}  // namespace
}  // namespace autograd
}  // namespace tandem
