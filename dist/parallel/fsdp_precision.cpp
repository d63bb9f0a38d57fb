// FullyShardedDataParallel's mixed precision and CPU offload (see fsdp.h): which dtype each unit is
// gathered, computed and reduced in, where its shard lives, and the casts, each fused into a copy the
// unit makes anyway (into the gather's buffer, into the reduction's buffer, out of the reduced shard).
#include <Eigen/Core>

#include "core/error.h"
#include "dist/parallel/fsdp.h"
#include "dist/parallel/fsdp_unit.h"
#include "nn/amp.h"
#include "nn/functional.h"

namespace tandem::dist {
namespace {

template <typename D, typename S>
void cast_scaled_loop(void* dst, const void* src, int64_t n, float factor) {
  auto* d = static_cast<D*>(dst);
  const auto* s = static_cast<const S*>(src);
  if (factor == 1.0f) {
    for (int64_t i = 0; i < n; ++i) d[i] = D(static_cast<float>(s[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = D(static_cast<float>(s[i]) * factor);
  }
}

template <typename S>
void cast_scaled_from(void* dst, DType to, const void* src, int64_t n, float factor) {
  switch (to) {
    case DType::Float32: return cast_scaled_loop<float, S>(dst, src, n, factor);
    case DType::BFloat16: return cast_scaled_loop<Eigen::bfloat16, S>(dst, src, n, factor);
    case DType::Float16: return cast_scaled_loop<Eigen::half, S>(dst, src, n, factor);
    default: TANDEM_FAIL("FSDP: no cast to ", dtype_name(to), " (float32, bfloat16 or float16 expected)");
  }
}

bool castable(DType t) { return t == kFloat32 || t == kBFloat16 || t == kFloat16; }

}  // namespace

void fsdp_cast_scaled(Tensor& dst, const Tensor& src, double factor) {
  TANDEM_CHECK(dst.numel() == src.numel() && dst.is_contiguous(), "FSDP: cast of ", src.str(), " into ", dst.str());
  const Tensor s = src.contiguous().view({src.numel()});
  Tensor d = dst.view({dst.numel()});
  if (s.device().is_cpu() && d.device().is_cuda()) {  // cpu_offload's upload: cast on the host, move param_dtype
    Tensor staged = Tensor::empty(d.shape(), d.dtype(), Device::cpu());
    fsdp_cast_scaled(staged, s, factor);
    d.copy_(staged);
    return;
  }
  if (s.device().is_cuda() && d.device().is_cpu()) {  // the reduced shard's download, cast on the host
    fsdp_cast_scaled(d, s.to(Device::cpu()), factor);
    return;
  }
  if (d.device().is_cuda() || !castable(d.dtype()) || !castable(s.dtype())) {  // float32 math, one rounding
    const Tensor wide = s.to(kFloat32);
    d.copy_(factor == 1.0 ? wide : nn::functional::scale(wide, factor));
    return;
  }
  // One pass: float32 math (src * float32(factor), as the reducer's copy_scaled), one rounding.
  const float f = static_cast<float>(factor);
  const int64_t n = s.numel();
  switch (s.dtype()) {
    case DType::Float32: return cast_scaled_from<float>(d.raw_data(), d.dtype(), s.raw_data(), n, f);
    case DType::BFloat16: return cast_scaled_from<Eigen::bfloat16>(d.raw_data(), d.dtype(), s.raw_data(), n, f);
    default: return cast_scaled_from<Eigen::half>(d.raw_data(), d.dtype(), s.raw_data(), n, f);
  }
}

DType parse_mixed_precision_dtype(const std::string& text) {
  const std::string name = text.rfind("torch.", 0) == 0 ? text.substr(6) : text;
  if (name == "bfloat16" || name == "bf16") return kBFloat16;
  if (name == "float16" || name == "half" || name == "fp16") return kFloat16;
  if (name == "float32" || name == "float" || name == "fp32") return kFloat32;
  TANDEM_FAIL("unknown mixed precision dtype '", text, "'; expected bfloat16, float16 or float32");
}

bool FullyShardedDataParallel::offloaded(const Unit& u) const {
  return options_.cpu_offload.offload_params && u.device.is_cuda();
}

bool FullyShardedDataParallel::transient(const Unit& u) const { return sharded() || u.mixed() || offloaded(u); }

void FullyShardedDataParallel::point_params(Unit& u, const std::shared_ptr<Storage>& flat, DType dtype) {
  const Tensor all = Tensor::from_storage(flat, {u.total}, dtype);
  for (size_t i = 0; i < u.params.size(); ++i) {
    Tensor& p = u.params[i].second;
    p.set_data(all.slice(0, u.offsets[i], u.offsets[i] + p.numel()).view(p.shape()));
  }
}

void FullyShardedDataParallel::setup_precision(Unit& u, bool full_precision) {
  const MixedPrecision& mp = options_.mixed_precision;
  u.full_precision = full_precision;
  u.param_dtype = u.reduce_dtype = u.dtype;
  if (full_precision || u.dtype != kFloat32) return;  // only float32 parameters are cast, as PyTorch's
  if (mp.param_dtype) u.param_dtype = *mp.param_dtype;
  u.reduce_dtype = mp.reduce_dtype ? *mp.reduce_dtype : u.param_dtype;
}

void FullyShardedDataParallel::cast_buffers() {
  const MixedPrecision& mp = options_.mixed_precision;
  for (const auto& [what, d] : {std::pair<const char*, std::optional<DType>>{"param_dtype", mp.param_dtype},
                                {"reduce_dtype", mp.reduce_dtype}, {"buffer_dtype", mp.buffer_dtype}})
    TANDEM_CHECK(!d || castable(*d), "FullyShardedDataParallel: mixed_precision.", what, " is ", dtype_name(*d),
                 "; expected bfloat16, float16 or float32");
  if (!mp.buffer_dtype) return;
  // Buffers of the modules that keep full precision stay as they are (PyTorch's rule).
  std::set<std::string> kept;
  auto walk = [&](auto& self, const nn::Module& m, const std::string& path) -> void {
    if (mp.module_classes_to_ignore.count(module_class_name(m)))
      for (auto& [name, b] : m.named_buffers()) kept.insert(path.empty() ? name : path + "." + name);
    for (auto& [name, child] : m.children()) self(self, *child, path.empty() ? name : path + "." + name);
  };
  walk(walk, *module_, "");
  for (auto& [name, b] : module_->named_buffers()) {
    if (kept.count(name) || b.dtype() != kFloat32 || b.dtype() == *mp.buffer_dtype) continue;
    buffer_dtypes_[name] = b.dtype();
    b.set_data(b.to(*mp.buffer_dtype));
  }
}

void FullyShardedDataParallel::summon(size_t k) {
  Unit& u = *units_[k];
  u.summoned = std::make_shared<Storage>(static_cast<size_t>(u.total * element_size(u.dtype)), u.device);
  Tensor out = Tensor::from_storage(u.summoned, {u.total}, u.dtype);
  const Tensor mine = u.shard.detach().to(u.device);
  if (sharded())
    group_->all_gather_into_tensor(out, mine.contiguous())->wait(group_->timeout());
  else
    out.copy_(mine);
  point_params(u, u.summoned, u.dtype);
}

void FullyShardedDataParallel::check_autocast() const {
  const auto& pd = options_.mixed_precision.param_dtype;
  if (!pd || *pd == kFloat32 || !amp::autocast_enabled()) return;
  TANDEM_FAIL("FullyShardedDataParallel: mixed_precision.param_dtype=", dtype_name(*pd), " and autocast (",
              amp::precision_name(amp::autocast_precision()), ", --amp or optim_wrapper AmpOptimWrapper) are both "
              "set; use one: mixed_precision casts the parameters, autocast casts the ops");
}

}  // namespace tandem::dist
