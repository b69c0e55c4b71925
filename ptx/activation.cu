// Activations, forward and backward, as element-wise map ops (see common/elementwise.cuh).
// Forward: in0 = x.  Backward: in0 = dy, in1 = y, in2 = x (each op reads only what it needs).
// p.coef: clipped-ReLU ceiling / ELU alpha; p.coef2: swish beta.
#include "common/elementwise.cuh"

namespace pydnn {
namespace act {

// sqrt(2/pi) and 1/sqrt(2*pi), 1/sqrt(2), for the GELU forms.
#define PYDNN_SQRT_2_OVER_PI 0.7978845608028654
#define PYDNN_INV_SQRT_2PI 0.3989422804014327
#define PYDNN_INV_SQRT_2 0.7071067811865476

struct Identity {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) { return alpha * x; }
};
struct Relu {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams& p, A alpha, A) {
    A r = x > A(0) ? x : A(0);
    if ((p.flags & PYDNN_FLAG_NAN_PROP) && m_isnan(x)) r = x;
    return alpha * r;
  }
};
struct ClippedRelu {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams& p, A alpha, A) {
    A c = (A)p.coef;
    A r = x > A(0) ? (x < c ? x : c) : A(0);
    if ((p.flags & PYDNN_FLAG_NAN_PROP) && m_isnan(x)) r = x;
    return alpha * r;
  }
};
struct Sigmoid {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) { return alpha * sigmoid(x); }
};
struct Tanh {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) { return alpha * m_tanh(x); }
};
struct Elu {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams& p, A alpha, A) {
    return alpha * (x > A(0) ? x : (A)p.coef * m_expm1(x));
  }
};
struct Swish {  // x * sigmoid(beta * x)
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams& p, A alpha, A) {
    return alpha * x * sigmoid((A)p.coef2 * x);
  }
};
struct GeluErf {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) {
    return alpha * A(0.5) * x * (A(1) + m_erf(x * (A)PYDNN_INV_SQRT_2));
  }
};
struct GeluTanh {  // 0.5 x (1 + tanh(u)) = x * sigmoid(2u): no cancellation for negative x
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) {
    A u = (A)PYDNN_SQRT_2_OVER_PI * (x + A(0.044715) * x * x * x);
    return alpha * x * sigmoid(A(2) * u);
  }
};

// ---- backward: dx = alpha * f'(.) * dy ----
struct IdentityBwd {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A dy, A, A, const MapParams&, A alpha, A) { return alpha * dy; }
};
struct ReluBwd {  // from x: dy where x > 0
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams&, A alpha, A) {
    return x > A(0) ? alpha * dy : A(0);
  }
};
struct ClippedReluBwd {
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams& p, A alpha, A) {
    return (x > A(0) && x < (A)p.coef) ? alpha * dy : A(0);
  }
};
struct SigmoidBwd {  // from y: y (1 - y)
  static constexpr unsigned reads = 1 | 2;
  template <class A> __device__ static A apply(A dy, A y, A, const MapParams&, A alpha, A) {
    return alpha * dy * y * (A(1) - y);
  }
};
struct TanhBwd {  // from y: 1 - y^2
  static constexpr unsigned reads = 1 | 2;
  template <class A> __device__ static A apply(A dy, A y, A, const MapParams&, A alpha, A) {
    return alpha * dy * (A(1) - y * y);
  }
};
struct EluBwd {  // from x: 1 for x > 0, alpha e^x otherwise
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams& p, A alpha, A) {
    return alpha * dy * (x > A(0) ? A(1) : (A)p.coef * m_exp(x));
  }
};
struct SwishBwd {  // s + b x s (1 - s), s = sigmoid(b x)
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams& p, A alpha, A) {
    A b = (A)p.coef2, s = sigmoid(b * x);
    return alpha * dy * (s + b * x * s * (A(1) - s));
  }
};
struct GeluErfBwd {  // Phi(x) + x phi(x)
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams&, A alpha, A) {
    A cdf = A(0.5) * (A(1) + m_erf(x * (A)PYDNN_INV_SQRT_2));
    A pdf = (A)PYDNN_INV_SQRT_2PI * m_exp(A(-0.5) * x * x);
    return alpha * dy * (cdf + x * pdf);
  }
};
struct GeluTanhBwd {  // s + 2 x s (1 - s) u', s = sigmoid(2u), 1 - s = sigmoid(-2u)
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams&, A alpha, A) {
    A k = (A)PYDNN_SQRT_2_OVER_PI;
    A u = k * (x + A(0.044715) * x * x * x);
    A du = k * (A(1) + A(3 * 0.044715) * x * x);
    A s = sigmoid(A(2) * u), sm = sigmoid(A(-2) * u);
    return alpha * dy * (s + A(2) * x * s * sm * du);
  }
};

}  // namespace act
}  // namespace pydnn
