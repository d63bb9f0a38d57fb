// The backend_ops case table: every op of kernels/ops.h mapped to its list of cases
// (backend_ops_pointwise_cases.h, backend_ops_reduce_cases.h, backend_ops_pool_cases.h,
// backend_ops_index_cases.h, backend_ops_nn_cases.h, backend_ops_layer_cases.h,
// backend_ops_update_cases.h). A new table op needs its list here,
// else BackendOpsTable.EveryRegisteredOpHasCases fails naming it.
#pragma once

#include "backend_ops_index_cases.h"
#include "backend_ops_layer_cases.h"
#include "backend_ops_nn_cases.h"
#include "backend_ops_pointwise_cases.h"
#include "backend_ops_pool_cases.h"
#include "backend_ops_reduce_cases.h"
#include "backend_ops_update_cases.h"

namespace tandem::backend_ops {

inline CaseTable backend_op_cases() {
  CaseTable t;
  add_pointwise_cases(t);
  add_reduce_cases(t);
  add_pool_cases(t);
  add_index_cases(t);
  add_nn_cases(t);
  add_layer_cases(t);
  add_update_cases(t);
  return t;
}

}  // namespace tandem::backend_ops
