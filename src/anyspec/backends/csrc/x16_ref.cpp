// The plain C++ reference of the interleaved products (the layout: x16.cpp): row n of a group block
// read back, then the canonical sums, one output at a time. No intrinsics: it builds on any machine,
// and every other level computes its bits.
#include <cmath>
#include <cstring>

#include "x16.h"

namespace anyspec {
namespace {

struct RowBlock {
  uint8_t q[256];
  int32_t sc[16], mn[8];  // Q4_K: sc[j] for j < 8 (per 32 weights); Q6_K: sc[s] per 16 weights
  float d, dmin;
};

void read_row(int64_t type, const uint8_t* gb, int n, RowBlock& o) {
  uint16_t d;
  std::memcpy(&d, gb + 2 * n, 2);
  o.d = half(d);
  if (type == Q4_K_X16) {
    uint16_t dm;
    std::memcpy(&dm, gb + 32 + 2 * n, 2);
    o.dmin = half(dm);
    for (int j = 0; j < 8; ++j) o.sc[j] = gb[64 + 16 * j + n];
    for (int i = 0; i < 4; ++i)
      for (int t = 0; t < 2; ++t) o.mn[2 * i + t] = gb[192 + 32 * i + 2 * n + t];
    const uint8_t* qs = gb + 320;
    for (int j = 0; j < 8; ++j)
      for (int c = 0; c < 4; ++c)
        for (int i = 0; i < 4; ++i) {
          const uint8_t byte = qs[((4 * j + c) * 16 + n) * 4 + i];
          o.q[32 * j + 4 * c + i] = byte & 15;
          o.q[32 * j + 16 + 4 * c + i] = byte >> 4;
        }
    return;
  }
  o.dmin = 0;
  for (int s = 0; s < 16; ++s) o.sc[s] = static_cast<int8_t>(gb[SC6 + 16 * s + n]);
  const uint8_t* ql = gb + QL6;
  const uint8_t* qh = gb + QH6;
  for (int s = 0; s < 16; ++s)
    for (int i = 0; i < 4; ++i) {
      const uint8_t h = qh[(16 * s + n) * 4 + i];
      for (int c = 0; c < 2; ++c) {
        const uint8_t l = ql[((2 * s + c) * 16 + n) * 4 + i];
        o.q[16 * s + 4 * c + i] = (l & 15) | (((h >> (2 * c)) & 3) << 4);
        o.q[16 * s + 8 + 4 * c + i] = (l >> 4) | (((h >> (2 * c + 4)) & 3) << 4);
      }
    }
}

// Row n of a 32-weight group block: weights (Q4 unsigned, Q8_0 signed), d and Q4_1's m.
void read_small(int64_t type, const uint8_t* gb, int n, int32_t* q, float& d, float& m) {
  uint16_t h;
  m = 0;
  if (type == S8_X16) {  // fp32 d and m
    std::memcpy(&d, gb + 4 * n, 4);
    std::memcpy(&m, gb + 64 + 4 * n, 4);
  } else {
    std::memcpy(&h, gb + 2 * n, 2);
    d = half(h);
  }
  if (type == Q4_1_X16) {
    std::memcpy(&h, gb + 32 + 2 * n, 2);
    m = half(h);
  }
  const bool wide = type == Q8_0_X16 || type == S8_X16;
  const uint8_t* qs = gb + (type == S8_X16 ? QS8 : QS);
  for (int c = 0; c < (wide ? 8 : 4); ++c)
    for (int i = 0; i < 4; ++i) {
      const uint8_t byte = qs[(16 * c + n) * 4 + i];
      if (wide) {
        q[4 * c + i] = static_cast<int8_t>(byte);
      } else {
        q[4 * c + i] = byte & 15;
        q[16 + 4 * c + i] = byte >> 4;
      }
    }
}

void small_rows_ref(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                    int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t nb = K / 32, gbytes = x16_group_bytes(type);
  int32_t q[32];
  float d, m;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t r = 0; r < a.M; ++r) {
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        read_small(type, w + ((n / 16) * nb + b) * gbytes, static_cast<int>(n % 16), q, d, m);
        const int8_t* x = a.q.data() + r * K + 32 * b;
        int32_t I = 0;
        for (int i = 0; i < 32; ++i) I += q[i] * x[i];
        I -= (type == Q4_0_X16 ? 8 : 0) * a.bsum32[r * nb + b];
        acc = std::fma(d * a.d[r * nb + b], static_cast<float>(I), acc);
        if (with_m(type)) acc = std::fma(m, a.sx[r * nb + b], acc);
      }
      y[r * ldy + n] = acc + (bias ? bias[n] : 0.0f);
    }
}

}  // namespace

void x16_rows_ref(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                  int64_t ldy, int64_t n0, int64_t n1) {
  if (small(type)) return small_rows_ref(type, w, K, a, bias, y, ldy, n0, n1);
  const int64_t nb = K / 256, gbytes = x16_group_bytes(type);
  RowBlock o;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* group = w + (n / 16) * nb * gbytes;
    for (int64_t r = 0; r < a.M; ++r) {
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        read_row(type, group + b * gbytes, static_cast<int>(n % 16), o);
        const int8_t* x = a.q.data() + r * K + 256 * b;
        int32_t I = 0, M = 0;
        if (type == Q4_K_X16) {
          for (int j = 0; j < 8; ++j) {
            int32_t dot = 0;
            for (int i = 32 * j; i < 32 * j + 32; ++i) dot += o.q[i] * x[i];
            I += o.sc[j] * dot;
            M += o.mn[j] * a.bsum32[r * (K / 32) + 8 * b + j];
          }
        } else {
          for (int s = 0; s < 16; ++s) {
            int32_t dot = 0;
            for (int i = 16 * s; i < 16 * s + 16; ++i) dot += o.q[i] * x[i];
            I += o.sc[s] * (dot - a.b16x32[r * (K / 16) + 16 * b + s]);
          }
        }
        const float dx = a.d[r * nb + b];
        acc = std::fma(o.d * dx, static_cast<float>(I), acc);
        acc = std::fma(-(o.dmin * dx), static_cast<float>(M), acc);
      }
      y[r * ldy + n] = acc + (bias ? bias[n] : 0.0f);
    }
  }
}

void x16_dequant_row(int64_t type, const uint8_t* w, int64_t K, int64_t n, float* out) {
  const int64_t nb = K / block_size(type), gbytes = x16_group_bytes(type);
  if (small(type)) {
    int32_t q[32];
    float d, m;
    for (int64_t b = 0; b < nb; ++b) {
      read_small(type, w + ((n / 16) * nb + b) * gbytes, static_cast<int>(n % 16), q, d, m);
      for (int i = 0; i < 32; ++i)
        out[32 * b + i] = with_m(type) ? d * q[i] + m : d * (q[i] - (type == Q4_0_X16 ? 8 : 0));
    }
    return;
  }
  RowBlock o;
  for (int64_t b = 0; b < nb; ++b) {
    read_row(type, w + ((n / 16) * nb + b) * gbytes, static_cast<int>(n % 16), o);
    for (int i = 0; i < 256; ++i)
      out[256 * b + i] = type == Q4_K_X16 ? o.d * o.sc[i / 32] * o.q[i] - o.dmin * o.mn[i / 32]
                                          : o.d * o.sc[i / 16] * (o.q[i] - 32);
  }
}


}  // namespace anyspec
