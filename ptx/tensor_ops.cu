// Tensor ops as element-wise map functors (common/elementwise.cuh):
//   Set       y = value                                  (SetTensor; p.coef holds the value)
//   Scaled    out = alpha * in0 (+ beta * out)           (ScaleTensor, AddTensor, TransformTensor)
//   Op*       C = op(alpha1 * A, alpha2 * B) + beta * C  (OpTensor; SQRT and NOT read A only)
#include "common/elementwise.cuh"

namespace pydnn {
namespace tensor {

struct Set {
  static constexpr unsigned reads = 0;
  template <class A> __device__ static A apply(A, A, A, const MapParams& p, A, A) { return (A)p.coef; }
};
struct Scaled {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A a, A, A, const MapParams&, A alpha, A) { return alpha * a; }
};
struct OpAdd {
  static constexpr unsigned reads = 3;
  template <class A> __device__ static A apply(A a, A b, A, const MapParams&, A al, A al2) { return al * a + al2 * b; }
};
struct OpMul {
  static constexpr unsigned reads = 3;
  template <class A> __device__ static A apply(A a, A b, A, const MapParams&, A al, A al2) { return (al * a) * (al2 * b); }
};
// MIN / MAX: with NaN propagation a NaN operand wins; without it the other operand does.
struct OpMin {
  static constexpr unsigned reads = 3;
  template <class A> __device__ static A apply(A a, A b, A, const MapParams& p, A al, A al2) {
    A x = al * a, y = al2 * b;
    if (m_isnan(x) || m_isnan(y)) return (p.flags & PYDNN_FLAG_NAN_PROP) ? (m_isnan(x) ? x : y) : (m_isnan(x) ? y : x);
    return x < y ? x : y;
  }
};
struct OpMax {
  static constexpr unsigned reads = 3;
  template <class A> __device__ static A apply(A a, A b, A, const MapParams& p, A al, A al2) {
    A x = al * a, y = al2 * b;
    if (m_isnan(x) || m_isnan(y)) return (p.flags & PYDNN_FLAG_NAN_PROP) ? (m_isnan(x) ? x : y) : (m_isnan(x) ? y : x);
    return x > y ? x : y;
  }
};
struct OpSqrt {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A a, A, A, const MapParams&, A al, A) { return m_sqrt(al * a); }
};
struct OpNot {  // cuDNN's logical NOT on real numbers: 1 - x
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A a, A, A, const MapParams&, A al, A) { return A(1) - al * a; }
};

}  // namespace tensor
}  // namespace pydnn
