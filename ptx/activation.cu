// Activations, forward and backward, as element-wise map ops (see common/elementwise.cuh).
// Forward: in0 = x.  Backward: in0 = dy, in1 = y, in2 = x (each op reads only what it needs).
// p.coef: clipped-ReLU ceiling / ELU alpha; p.coef2: swish beta.
// FAST (used for half and bfloat16 storage): exp and division by the hardware approximations, whose
// float32 error (a few ulps) is far below the 16-bit output's rounding; float and double stay exact.
#include "common/elementwise.cuh"

namespace pydnn {
namespace act {

template <bool FAST, class A> __device__ __forceinline__ A ex(A x) { return m_exp(x); }
template <> __device__ __forceinline__ float ex<true, float>(float x) { return __expf(x); }
template <bool FAST, class A> __device__ __forceinline__ A sigmoid(A x) { return pydnn::sigmoid(x); }
template <> __device__ __forceinline__ float sigmoid<true, float>(float x) {
  float e = __expf(-fabsf(x));
  float s = __fdividef(1.0f, 1.0f + e);
  return x >= 0.0f ? s : e * s;
}

// sqrt(2/pi) and 1/sqrt(2*pi), 1/sqrt(2), for the GELU forms.
#define PYDNN_SQRT_2_OVER_PI 0.7978845608028654
#define PYDNN_INV_SQRT_2PI 0.3989422804014327
#define PYDNN_INV_SQRT_2 0.7071067811865476

template <bool FAST> struct Identity {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) { return alpha * x; }
};
template <bool FAST> struct Relu {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams& p, A alpha, A) {
    A r = x > A(0) ? x : A(0);
    if ((p.flags & PYDNN_FLAG_NAN_PROP) && m_isnan(x)) r = x;
    return alpha * r;
  }
};
template <bool FAST> struct ClippedRelu {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams& p, A alpha, A) {
    A c = (A)p.coef;
    A r = x > A(0) ? (x < c ? x : c) : A(0);
    if ((p.flags & PYDNN_FLAG_NAN_PROP) && m_isnan(x)) r = x;
    return alpha * r;
  }
};
template <bool FAST> struct Sigmoid {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) { return alpha * sigmoid<FAST>(x); }
};
template <bool FAST> struct Tanh {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) { return alpha * m_tanh(x); }
};
template <bool FAST> struct Elu {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams& p, A alpha, A) {
    return alpha * (x > A(0) ? x : (A)p.coef * m_expm1(x));
  }
};
template <bool FAST> struct Swish {  // x * sigmoid(beta * x)
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams& p, A alpha, A) {
    return alpha * x * sigmoid<FAST>((A)p.coef2 * x);
  }
};
template <bool FAST> struct GeluErf {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) {
    return alpha * A(0.5) * x * (A(1) + m_erf(x * (A)PYDNN_INV_SQRT_2));
  }
};
template <bool FAST> struct GeluTanh {  // 0.5 x (1 + tanh(u)) = x * sigmoid(2u): no cancellation for negative x
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) {
    A u = (A)PYDNN_SQRT_2_OVER_PI * (x + A(0.044715) * x * x * x);
    return alpha * x * sigmoid<FAST>(A(2) * u);
  }
};

// ---- backward: dx = alpha * f'(.) * dy ----
template <bool FAST> struct IdentityBwd {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A dy, A, A, const MapParams&, A alpha, A) { return alpha * dy; }
};
template <bool FAST> struct ReluBwd {  // from x: dy where x > 0
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams&, A alpha, A) {
    return x > A(0) ? alpha * dy : A(0);
  }
};
template <bool FAST> struct ClippedReluBwd {
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams& p, A alpha, A) {
    return (x > A(0) && x < (A)p.coef) ? alpha * dy : A(0);
  }
};
template <bool FAST> struct SigmoidBwd {  // from y: y (1 - y)
  static constexpr unsigned reads = 1 | 2;
  template <class A> __device__ static A apply(A dy, A y, A, const MapParams&, A alpha, A) {
    return alpha * dy * y * (A(1) - y);
  }
};
template <bool FAST> struct TanhBwd {  // from y: 1 - y^2
  static constexpr unsigned reads = 1 | 2;
  template <class A> __device__ static A apply(A dy, A y, A, const MapParams&, A alpha, A) {
    return alpha * dy * (A(1) - y * y);
  }
};
template <bool FAST> struct EluBwd {  // from x: 1 for x > 0, alpha e^x otherwise
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams& p, A alpha, A) {
    return alpha * dy * (x > A(0) ? A(1) : (A)p.coef * ex<FAST>(x));
  }
};
template <bool FAST> struct SwishBwd {  // s + b x s (1 - s), s = sigmoid(b x)
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams& p, A alpha, A) {
    A b = (A)p.coef2, s = sigmoid<FAST>(b * x);
    return alpha * dy * (s + b * x * s * (A(1) - s));
  }
};
template <bool FAST> struct GeluErfBwd {  // Phi(x) + x phi(x)
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams&, A alpha, A) {
    A cdf = A(0.5) * (A(1) + m_erf(x * (A)PYDNN_INV_SQRT_2));
    A pdf = (A)PYDNN_INV_SQRT_2PI * ex<FAST>(A(-0.5) * x * x);
    return alpha * dy * (cdf + x * pdf);
  }
};
template <bool FAST> struct GeluTanhBwd {  // s + 2 x s (1 - s) u', s = sigmoid(2u), 1 - s = sigmoid(-2u)
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams&, A alpha, A) {
    A k = (A)PYDNN_SQRT_2_OVER_PI;
    A u = k * (x + A(0.044715) * x * x * x);
    A du = k * (A(1) + A(3 * 0.044715) * x * x);
    A s = sigmoid<FAST>(A(2) * u), sm = sigmoid<FAST>(A(-2) * u);
    return alpha * dy * (s + A(2) * x * s * sm * du);
  }
};

}  // namespace act
}  // namespace pydnn
