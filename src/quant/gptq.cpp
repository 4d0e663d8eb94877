// GPTQ (gptq.h). The factor U (H^-1 = U^T U, U upper) comes from one
// Cholesky factorisation of H with its rows and columns reversed: if
// J H J = M M^T (M lower), then H = R R^T with R = J M J upper, so
// H^-1 = R^-T R^-1 and U = R^-1. Arithmetic in double; each row's update in
// float, as the published implementations do.
#include "quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/threads.h"
#include "numerics/int4_rtn.h"

namespace kvant {
namespace {

// Lower Cholesky factor of A (n x n, row-major) in place; false when A is
// not positive definite.
bool cholesky_lower(std::vector<double>& A, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    double d = A[size_t(j * n + j)];
    for (int64_t k = 0; k < j; ++k) d -= A[size_t(j * n + k)] * A[size_t(j * n + k)];
    if (!(d > 0)) return false;
    const double ljj = std::sqrt(d);
    A[size_t(j * n + j)] = ljj;
    parallel_for(n - j - 1, 64, [&](int64_t b, int64_t e) {
      for (int64_t i = j + 1 + b; i < j + 1 + e; ++i) {
        double s = A[size_t(i * n + j)];
        const double* ai = &A[size_t(i * n)];
        const double* aj = &A[size_t(j * n)];
        for (int64_t k = 0; k < j; ++k) s -= ai[k] * aj[k];
        A[size_t(i * n + j)] = s / ljj;
      }
    });
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) A[size_t(i * n + j)] = 0;
  return true;
}

// U (upper, row-major) with H^-1 = U^T U, for H positive definite.
Result<std::vector<float>> inverse_upper_factor(const std::vector<double>& H, int64_t n) {
  std::vector<double> M(size_t(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) M[size_t(i * n + j)] = H[size_t((n - 1 - i) * n + (n - 1 - j))];
  if (!cholesky_lower(M, n))
    return make_error("gptq: the Hessian is not positive definite after dampening");
  // R = J M J is upper: R[i][j] = M[n-1-i][n-1-j]. U = R^-1, upper, by back
  // substitution one column at a time (columns are independent).
  auto R = [&](int64_t i, int64_t j) { return M[size_t((n - 1 - i) * n + (n - 1 - j))]; };
  std::vector<float> U(size_t(n * n), 0.f);
  parallel_for(n, 16, [&](int64_t b, int64_t e) {
    std::vector<double> col(static_cast<size_t>(n));
    for (int64_t j = b; j < e; ++j) {
      // Solve R u = e_j for u (u[i] = 0 for i > j).
      std::fill(col.begin(), col.end(), 0.0);
      for (int64_t i = j; i >= 0; --i) {
        double s = i == j ? 1.0 : 0.0;
        for (int64_t k = i + 1; k <= j; ++k) s -= R(i, k) * col[size_t(k)];
        col[size_t(i)] = s / R(i, i);
      }
      for (int64_t i = 0; i <= j; ++i) U[size_t(i * n + j)] = float(col[size_t(i)]);
    }
  });
  return U;
}

// (W - W') H (W - W')^T summed over rows, / rows.
double output_error(const float* w, const std::vector<float>& deq, int64_t rows, int64_t cols,
                    const std::vector<double>& H) {
  std::vector<double> part(size_t(rows), 0.0);
  parallel_for(rows, 8, [&](int64_t b, int64_t e) {
    std::vector<double> d(static_cast<size_t>(cols));
    for (int64_t r = b; r < e; ++r) {
      for (int64_t c = 0; c < cols; ++c)
        d[size_t(c)] = double(w[r * cols + c]) - deq[size_t(r * cols + c)];
      double t = 0;
      for (int64_t i = 0; i < cols; ++i) {
        double s = 0;
        const double* hi = &H[size_t(i * cols)];
        for (int64_t j = 0; j < cols; ++j) s += hi[j] * d[size_t(j)];
        t += d[size_t(i)] * s;
      }
      part[size_t(r)] = t;
    }
  });
  double total = 0;
  for (double t : part) total += t;
  return total / double(std::max<int64_t>(rows, 1));
}

}  // namespace

Result<Int4Weight> gptq_quantize(const float* w, int64_t rows, int64_t cols,
                                 const std::vector<double>& H0, const GptqOptions& o,
                                 GptqStats* stats) {
  const int64_t n = cols, G = o.group, ng = (cols + G - 1) / G;
  if (int64_t(H0.size()) != n * n) return make_error("gptq: Hessian size does not match the weight");
  std::vector<double> H = H0;
  std::vector<uint8_t> dead(size_t(n), 0);
  double mean_diag = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (H[size_t(i * n + i)] == 0) {
      dead[size_t(i)] = 1;
      H[size_t(i * n + i)] = 1;
    }
    mean_diag += H[size_t(i * n + i)];
  }
  mean_diag /= double(n);
  for (int64_t i = 0; i < n; ++i) H[size_t(i * n + i)] += o.damp * mean_diag;
  // Processing order.
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  if (o.act_order)
    std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
      return H0[size_t(a * n + a)] > H0[size_t(b * n + b)];
    });
  std::vector<double> Hp(size_t(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) Hp[size_t(i * n + j)] = H[size_t(perm[size_t(i)] * n + perm[size_t(j)])];
  auto U = inverse_upper_factor(Hp, n);
  if (!U) return U.error();

  std::vector<float> hdiag(static_cast<size_t>(n));  // by original column
  for (int64_t i = 0; i < n; ++i) hdiag[size_t(i)] = float(H[size_t(i * n + i)]);
  auto group_params = [&](const float* v, const float* h, int len) {
    return o.clip ? int4_group_params_clipped(v, h, len, o.asym) : int4_group_params(v, len, o.asym);
  };
  Int4Weight out;
  out.rows = rows, out.cols = cols, out.group = G;
  out.q.resize(size_t(rows * cols));
  out.scale.resize(size_t(rows * ng));
  if (o.asym) out.zero.resize(size_t(rows * ng));
  parallel_for(rows, 4, [&](int64_t b, int64_t e) {
    std::vector<float> x(static_cast<size_t>(n));
    std::vector<Int4GroupParams> gp(static_cast<size_t>(ng));
    std::vector<uint8_t> have(static_cast<size_t>(ng));
    for (int64_t r = b; r < e; ++r) {
      const float* wr = w + r * cols;
      std::fill(have.begin(), have.end(), 0);
      if (o.act_order) {  // static groups from the original weights
        for (int64_t g = 0; g < ng; ++g) {
          std::vector<float> grp(wr + g * G, wr + std::min(cols, (g + 1) * G));
          for (int64_t c = g * G; c < std::min(cols, (g + 1) * G); ++c)
            if (dead[size_t(c)]) grp[size_t(c - g * G)] = 0;
          gp[size_t(g)] = group_params(grp.data(), hdiag.data() + g * G, int(grp.size()));
          have[size_t(g)] = 1;
        }
      }
      for (int64_t i = 0; i < n; ++i) x[size_t(i)] = dead[size_t(perm[size_t(i)])] ? 0.f : wr[perm[size_t(i)]];
      for (int64_t i = 0; i < n; ++i) {
        const int64_t c = perm[size_t(i)], g = c / G;
        if (!have[size_t(g)]) {  // dynamic: this group's current values (identity order)
          const int64_t c1 = std::min(cols, (g + 1) * G);
          gp[size_t(g)] = group_params(x.data() + i, hdiag.data() + c, int(c1 - c));
          have[size_t(g)] = 1;
        }
        const Int4GroupParams& p = gp[size_t(g)];
        const int8_t q = int4_code(x[size_t(i)], p, o.asym);
        out.q[size_t(r * cols + c)] = q;
        const float deq = float(q - p.zero) * p.scale;
        const float* ui = U->data() + i * n;
        const float err = (x[size_t(i)] - deq) / ui[i];
        for (int64_t j = i + 1; j < n; ++j) x[size_t(j)] -= err * ui[j];
      }
      for (int64_t g = 0; g < ng; ++g) {
        out.scale[size_t(r * ng + g)] = gp[size_t(g)].scale;
        if (o.asym) out.zero[size_t(r * ng + g)] = gp[size_t(g)].zero;
      }
    }
  });
  if (stats) {
    std::vector<float> deq(size_t(rows * cols));
    dequantize(out, deq.data());
    stats->err_gptq = output_error(w, deq, rows, cols, H0);
    const Int4Weight rtn = rtn_quantize(w, rows, cols, G, o.asym);
    dequantize(rtn, deq.data());
    stats->err_rtn = output_error(w, deq, rows, cols, H0);
  }
  return out;
}

}  // namespace kvant
