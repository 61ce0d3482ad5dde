#include "bn/reference.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace bnps::bn::reference {

std::vector<double> Channel(const std::vector<float>& x, const Shape& shape,
                            int64_t c) {
  std::vector<double> out;
  out.reserve(shape.PerChannel());
  const int64_t len = shape.Spatial();
  for (int64_t i = 0; i < shape.n; ++i) {
    for (int64_t s = 0; s < len; ++s) {
      out.push_back(x[(i * shape.c + c) * len + s]);
    }
  }
  return out;
}

Stats ComputeStats(const std::vector<float>& x, const Shape& shape) {
  Stats st;
  st.count = shape.PerChannel();
  for (int64_t c = 0; c < shape.c; ++c) {
    const std::vector<double> v = Channel(x, shape, c);
    long double sum = 0;
    for (double e : v) sum += e;
    const long double mean = v.empty() ? 0 : sum / v.size();
    long double m2 = 0;
    for (double e : v) m2 += (e - mean) * (e - mean);
    st.mean.push_back(static_cast<double>(mean));
    st.m2.push_back(static_cast<double>(m2));
    st.var.push_back(v.empty() ? 0.0 : static_cast<double>(m2 / v.size()));
  }
  return st;
}

std::vector<double> Normalize(const std::vector<float>& x, const Shape& shape,
                              const std::vector<double>& mean,
                              const std::vector<double>& var,
                              const std::vector<float>& gamma,
                              const std::vector<float>& beta, double eps) {
  std::vector<double> y(x.size());
  const int64_t len = shape.Spatial();
  for (int64_t i = 0; i < shape.n; ++i) {
    for (int64_t c = 0; c < shape.c; ++c) {
      const double inv = 1.0 / std::sqrt(var[c] + eps);
      for (int64_t s = 0; s < len; ++s) {
        const int64_t k = (i * shape.c + c) * len + s;
        y[k] = gamma[c] * (x[k] - mean[c]) * inv + beta[c];
      }
    }
  }
  return y;
}

Gradients Backward(const std::vector<float>& dy, const std::vector<float>& x,
                   const Shape& shape, const std::vector<float>& gamma,
                   double eps) {
  const Stats st = ComputeStats(x, shape);
  Gradients g;
  g.dx.assign(x.size(), 0.0);
  g.dgamma.assign(shape.c, 0.0);
  g.dbeta.assign(shape.c, 0.0);
  const int64_t len = shape.Spatial();
  const double n = static_cast<double>(st.count);
  for (int64_t c = 0; c < shape.c; ++c) {
    const double inv = 1.0 / std::sqrt(st.var[c] + eps);
    auto at = [&](int64_t i, int64_t s) { return (i * shape.c + c) * len + s; };
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t i = 0; i < shape.n; ++i) {
      for (int64_t s = 0; s < len; ++s) {
        const int64_t k = at(i, s);
        sum_dy += dy[k];
        sum_dy_xhat += dy[k] * (x[k] - st.mean[c]) * inv;
      }
    }
    g.dbeta[c] = sum_dy;
    g.dgamma[c] = sum_dy_xhat;
    for (int64_t i = 0; i < shape.n; ++i) {
      for (int64_t s = 0; s < len; ++s) {
        const int64_t k = at(i, s);
        const double xhat = (x[k] - st.mean[c]) * inv;
        g.dx[k] = gamma[c] * inv / n * (n * dy[k] - sum_dy - xhat * sum_dy_xhat);
      }
    }
  }
  return g;
}

std::vector<float> RandomTensor(const Shape& shape, double mean, double std,
                                uint64_t seed, double mean_step) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, std);
  std::vector<float> x(shape.Elements());
  const int64_t len = shape.Spatial();
  for (int64_t i = 0; i < shape.n; ++i) {
    for (int64_t c = 0; c < shape.c; ++c) {
      for (int64_t s = 0; s < len; ++s) {
        x[(i * shape.c + c) * len + s] =
            static_cast<float>(mean + c * mean_step + normal(rng));
      }
    }
  }
  return x;
}

std::vector<float> RandomVector(int64_t size, double lo, double hi,
                                uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<float> v(size);
  for (float& e : v) e = static_cast<float>(u(rng));
  return v;
}

double MaxRelativeError(const std::vector<double>& got,
                        const std::vector<double>& want, double floor) {
  if (got.size() != want.size()) return INFINITY;
  double err = 0, scale = floor;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    err = std::max(err, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return err / scale;
}

double MaxRelativeError(const std::vector<float>& got,
                        const std::vector<double>& want, double floor) {
  return MaxRelativeError(std::vector<double>(got.begin(), got.end()), want,
                          floor);
}

std::vector<float> SliceBatch(const std::vector<float>& x, const Shape& shape,
                              int64_t begin, int64_t end) {
  const int64_t row = shape.c * shape.Spatial();
  return std::vector<float>(x.begin() + begin * row, x.begin() + end * row);
}

}  // namespace bnps::bn::reference
