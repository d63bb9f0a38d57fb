#include <gtest/gtest.h>

#include "core/tensor.h"

using namespace tandem;

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor tr = t.transpose(0, 1);
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.contiguous().to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  Tensor s = t.slice(1, 1, 3);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{2, 3, 5, 6}));
  s.fill_(0);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 0, 0, 4, 0, 0}));
}
