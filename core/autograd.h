// The autograd engine: a define-by-run tape. Each differentiable op records a
// Node holding what it saved (detached tensors, so no cycles) and edges to the
// nodes that produced its inputs. backward() counts dependencies and runs
// ready nodes latest-recorded first (highest sequence number), so the last
// layer's gradients are final first. A leaf that requires grad is reached
// through its AccumulateGrad node, which sums incoming gradients into .grad
// and then fires the leaf's post-accumulate hooks: once per backward, when the
// leaf's gradient for that backward is final. Backward runs on the calling
// thread; hooks run there too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tandem {

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  // grads[i] is the gradient of output i (undefined if nothing flowed there).
  // Returns one gradient per next edge (undefined where not needed).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  virtual std::string name() const = 0;
  virtual uint32_t num_outputs() const { return 1; }

  uint64_t sequence_nr() const { return sequence_nr_; }
  bool needs_input_grad(size_t i) const { return i < next_edges.size() && next_edges[i].valid(); }

  std::vector<Edge> next_edges;

 protected:
  // Gradient accumulators rank above every other node (their numbers start at 2^63, then count up
  // as the others do), so that a leaf's gradient is accumulated, and its post-accumulate hooks run,
  // as soon as it is ready in every backward, as PyTorch's AccumulateGrad (sequence_nr UINT64_MAX)
  // is. Nodes made during forward count up, so an accumulator made in an earlier iteration would
  // otherwise wait behind all of them. Among themselves the later made still goes first.
  struct LeafAccumulator {};
  explicit Node(LeafAccumulator);

 private:
  uint64_t sequence_nr_;
};

// Sums gradients into a leaf's .grad, then runs its post-accumulate hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf)
      : Node(LeafAccumulator{}), leaf_(std::move(leaf)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

// Grad mode is per thread. Inside a NoGradGuard ops record nothing.
class GradMode {
 public:
  static bool enabled();
  static void set_enabled(bool enabled);
};

class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

namespace autograd {

// The edge a gradient for t should flow along: its grad_fn, its leaf
// accumulator, or an invalid edge if t does not require grad.
Edge gradient_edge(const Tensor& t);

// True when grad mode is on and any input requires grad.
bool any_requires_grad(std::initializer_list<Tensor> inputs);

// Records fn as the producer of outputs and connects it to the inputs' edges.
// Returns fn for convenience. Call only when any_requires_grad(inputs).
void record(const std::shared_ptr<Node>& fn, std::initializer_list<Tensor> inputs,
            std::initializer_list<Tensor*> outputs);

// Runs backward from roots; grads[i] defaults to ones for a scalar root.
// Callbacks queued during the run (queue_callback) run after the last node,
// in the order queued, still inside backward(); their exceptions propagate.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads);

// How many ops this thread has recorded so far (record() calls): a clock that advances once an
// op has computed its outputs (dist/parallel/fsdp.h frees a unit's gathered parameters only after
// the op that was reading them has recorded).
uint64_t recorded_ops();

// From inside a running backward (a hook or a node on this thread): runs fn
// once the whole graph has been processed. Throws outside a backward.
void queue_callback(std::function<void()> fn);

}  // namespace autograd
}  // namespace tandem
