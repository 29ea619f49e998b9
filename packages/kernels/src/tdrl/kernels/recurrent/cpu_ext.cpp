// GRU / LSTM time loops on the CPU, float32: the per-step loops of recurrent/cpu.py in C++.
//
// Built just in time by recurrent/cpu_ext.py (torch.utils.cpp_extension); the Python side keeps
// the autograd.Function, the workspace pool and the weight / bias reordering, and calls these
// functions for the whole forward or backward time loop. Per step: the GEMMs through at::mm_out
// / addmm_ on the caller's buffers, and the gate maths as ONE vectorised pass over the rows
// (at::vec::Vectorized<float>; sigmoid and tanh from one clamped polynomial exp and a division,
// NaN propagated, inf saturating to 0 / +-1: Sleef's exp / tanh calls left the pass ~2x slower).
// Layouts as cpu.py's docstrings: time-major [T, N, .] buffers whose rows may be strided
// (a batch-first output seen through .transpose(0, 1)); the last dim always has stride 1.
// An empty (numel 0) tensor means "not needed" (no workspace to save, no gradient wanted).
// Stacked networks (seeds trained as one model): weights [S, ., .] and biases [S, .]; the N rows
// are S blocks of N / S, block s run through network s: each GEMM a batched GEMM over S (bmm),
// the gate pass unchanged but for the bias row of each block.

#include <torch/extension.h>
#include <ATen/cpu/vec/vec.h>

#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
using at::Tensor;
constexpr int64_t W = Vec::size();

// exp on [-87.3, 88] (clamped outside: enough for sigmoid / tanh), NaN kept: Cephes' expf
// polynomial (~1 ulp on the reduced range), a few FMAs instead of a Sleef call.
inline Vec exp_clamped(const Vec& v) {
#if defined(CPU_CAPABILITY_AVX2)
  // _mm256_min_ps / max_ps return the second operand when either is NaN: x goes second
  __m256 x = _mm256_min_ps(_mm256_set1_ps(88.f), v);
  x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                              _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201E-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return Vec(_mm256_mul_ps(p, _mm256_castsi256_ps(e)));
#else
  return v.exp();
#endif
}

inline Vec sigmoid(const Vec& v) {
  const Vec one(1.f);
  return one / (one + exp_clamped(v.neg()));
}

// tanh(x) = 1 - 2 / (1 + exp(2x)): absolute error ~1e-7 (as float32's own spacing near 1)
inline Vec tanh_(const Vec& v) {
  const Vec one(1.f), two(2.f);
  return one - two / (one + exp_clamped(v + v));
}

inline bool defined(const Tensor& t) { return t.defined() && t.numel() > 0; }

// out = a @ w: w [K, M], or [S, K, M] with a's rows in S blocks (block s times w[s])
inline void mm_rows(const Tensor& out, const Tensor& a, const Tensor& w) {
  if (w.dim() == 2) {
    at::mm_out(const_cast<Tensor&>(out), a, w);
    return;
  }
  const int64_t S = w.size(0);
  Tensor o = out.unflatten(0, {S, -1});
  at::bmm_out(o, a.unflatten(0, {S, -1}), w);
}

// out += a @ w (as mm_rows)
inline void addmm_rows(const Tensor& out, const Tensor& a, const Tensor& w) {
  if (w.dim() == 2) {
    const_cast<Tensor&>(out).addmm_(a, w);
    return;
  }
  const int64_t S = w.size(0);
  out.unflatten(0, {S, -1}).baddbmm_(a.unflatten(0, {S, -1}), w);
}

// dw += d^T @ x over the rows (a weight gradient): dw [K, M], or [S, K, M] per block of rows
inline void wgrad_rows(const Tensor& dw, const Tensor& d, const Tensor& x) {
  if (dw.dim() == 2) {
    const_cast<Tensor&>(dw).addmm_(d.t(), x);
    return;
  }
  const int64_t S = dw.size(0);
  const_cast<Tensor&>(dw).baddbmm_(d.unflatten(0, {S, -1}).transpose(1, 2), x.unflatten(0, {S, -1}));
}

// rows per network (n for one network, n / S for S stacked) and the bias stride between blocks
inline int64_t block_rows(const Tensor& bias, int64_t n) { return bias.dim() == 2 ? n / bias.size(0) : n; }
inline int64_t bias_step(const Tensor& bias) { return bias.dim() == 2 ? bias.size(1) : 0; }

void check(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, "tdrl recurrent ext: ", name,
              " must be a float32 CPU tensor");
  TORCH_CHECK(t.numel() == 0 || t.stride(-1) == 1, "tdrl recurrent ext: ", name,
              " needs a unit last-dim stride");
}

// [T] whether any row resets before step t (keep[:, t] == 0 somewhere)
std::vector<char> reset_steps(const Tensor& keep) {
  const int64_t n = keep.size(0), t_len = keep.size(1);
  auto k = keep.accessor<float, 2>();
  std::vector<char> out(t_len, 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < t_len; ++t)
      if (k[i][t] == 0.f) out[t] = 1;
  return out;
}

// dst = src * keep[:, t] (a reset state), rows of H floats
void mask_rows(const Tensor& src, const Tensor& keep, int64_t t, const Tensor& dst) {
  const int64_t n = src.size(0), H = src.size(1);
  auto k = keep.accessor<float, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const float* s = src.data_ptr<float>() + i * src.stride(0);
    float* d = dst.data_ptr<float>() + i * dst.stride(0);
    const float ki = k[i][t];
    for (int64_t j = 0; j < H; ++j) d[j] = s[j] * ki;
  }
}

// --------------------------------------------------------------------------------------- GRU

// X [T, N, F]; HS [T, N, H] (out); G [T, N, 5H] (out: r, z, (1 - n^2)(1 - z),
// r (1 - r) (W_hn h + b_hn), z (1 - z) (h_prev - n)) or empty; w_ih_t [F, 3H], w_hh_t [H, 3H]
// (transposed views of nn.GRU's weights), bias [4H] = (b_ir + b_hr, b_iz + b_hz, b_in, b_hn).
void gru_forward(const Tensor& X, const Tensor& h0, const Tensor& keep, const Tensor& w_ih_t,
                 const Tensor& w_hh_t, const Tensor& bias, const Tensor& HS, const Tensor& G) {
  check(X, "x"), check(h0, "h0"), check(HS, "hs"), check(G, "G"), check(bias, "bias");
  const int64_t t_len = X.size(0), n = X.size(1), H = h0.size(1);
  const bool save = defined(G);
  const auto resets = reset_steps(keep);
  auto k = keep.accessor<float, 2>();
  Tensor s = at::empty({n, 3 * H}, X.options()), gh = at::empty({n, 3 * H}, X.options());
  Tensor hp_buf = at::empty({n, H}, X.options());
  const float* b0 = bias.data_ptr<float>();
  const int64_t nb = block_rows(bias, n), bstep = bias_step(bias);
  Tensor hp = h0;
  if (t_len && resets[0]) {
    mask_rows(h0, keep, 0, hp_buf);
    hp = hp_buf;
  }
  for (int64_t t = 0; t < t_len; ++t) {
    mm_rows(s, X[t], w_ih_t);
    mm_rows(gh, hp, w_hh_t);
    Tensor hs_t = HS[t];
    const bool next_reset = t + 1 < t_len && resets[t + 1];
    const int64_t hs_rs = hs_t.stride(0), hp_rs = hp.stride(0);
    float* hsp = hs_t.data_ptr<float>();
    const float* hpp = hp.data_ptr<float>();
    float* gp = save ? G[t].data_ptr<float>() : nullptr;
    const float* sp = s.data_ptr<float>();
    const float* ghp = gh.data_ptr<float>();
    float* nxt = hp_buf.data_ptr<float>();  // the next step's reset state (when it resets)
    for (int64_t i = 0; i < n; ++i) {
      const float* b = b0 + (i / nb) * bstep;
      const float* si = sp + i * 3 * H;
      const float* ghi = ghp + i * 3 * H;
      const float* hpi = hpp + i * hp_rs;
      float* hi = hsp + i * hs_rs;
      float* gi = save ? gp + i * 5 * H : nullptr;
      const Vec kn(next_reset ? k[i][t + 1] : 1.f);
      const Vec one(1.f);
      for (int64_t j = 0; j < H; j += W) {
        const int64_t c = std::min(W, H - j);
        Vec r = sigmoid(Vec::loadu(si + j, c) + Vec::loadu(ghi + j, c) + Vec::loadu(b + j, c));
        Vec z = sigmoid(Vec::loadu(si + H + j, c) + Vec::loadu(ghi + H + j, c) +
                        Vec::loadu(b + H + j, c));
        Vec ghn = Vec::loadu(ghi + 2 * H + j, c) + Vec::loadu(b + 3 * H + j, c);
        Vec nn = tanh_(Vec::loadu(si + 2 * H + j, c) + Vec::loadu(b + 2 * H + j, c) + r * ghn);
        Vec diff = Vec::loadu(hpi + j, c) - nn;
        Vec h = nn + z * diff;
        h.store(hi + j, c);
        if (next_reset) (h * kn).store(nxt + i * H + j, c);
        if (save) {
          r.store(gi + j, c);
          z.store(gi + H + j, c);
          ((one - nn * nn) * (one - z)).store(gi + 2 * H + j, c);
          (r * (one - r) * ghn).store(gi + 3 * H + j, c);
          (z * (one - z) * diff).store(gi + 4 * H + j, c);
        }
      }
    }
    if (t + 1 < t_len) hp = next_reset ? hp_buf : hs_t;
    // hp_buf is read by the next step's GEMM before this loop writes it again
  }
}

// Returns dh0. X, HS, G as saved by gru_forward; g [T, N, H] (strides free, time stride may be
// 0; empty: no output gradient); w_p [3H, H] = W_hh's rows (n, r, z); w_ih [3H, F];
// DX [T, N, F], dw_ih [3H, F], dw_p [3H, H] (rows n, r, z), db [4H] = (b_hn, b_r, b_z, b_in):
// outputs (accumulated into; empty when not wanted).
Tensor gru_backward(const Tensor& X, const Tensor& HS, const Tensor& G, const Tensor& h0,
                    const Tensor& keep, const Tensor& w_p, const Tensor& w_ih, const Tensor& g,
                    const Tensor& DX, const Tensor& dw_ih, const Tensor& dw_p, const Tensor& db) {
  check(X, "x"), check(HS, "hs"), check(G, "G"), check(g, "grad");
  const int64_t t_len = X.size(0), n = X.size(1), H = h0.size(1);
  const auto resets = reset_steps(keep);
  auto k = keep.accessor<float, 2>();
  const bool has_g = defined(g);
  // d: (d ghn, d r_pre, d z_pre, d n_pre); [:3H] pairs with w_p, [H:4H] with w_ih
  Tensor d = at::empty({n, 4 * H}, X.options());
  Tensor dh = at::zeros({n, H}, X.options());  // d loss / d (the reset state entering step t+1)
  Tensor hp_buf = at::empty({n, H}, X.options());
  Tensor dgh = d.narrow(1, 0, 3 * H), dgi = d.narrow(1, H, 3 * H);
  std::vector<float> dbacc(defined(db) ? db.numel() : 0, 0.f);
  const int64_t nb = defined(db) && db.dim() == 2 ? n / db.size(0) : n;
  float* dp = d.data_ptr<float>();
  float* dhp = dh.data_ptr<float>();
  for (int64_t t = t_len - 1; t >= 0; --t) {
    const bool from_next = t + 1 < t_len, mask = from_next && resets[t + 1];
    const float* gt = has_g ? g.data_ptr<float>() + t * g.stride(0) : nullptr;
    const int64_t g_rs = has_g ? g.stride(1) : 0;
    const float* gp = G[t].data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      const float* gi = gp + i * 5 * H;
      float* di = dp + i * 4 * H;
      float* dhi = dhp + i * H;
      const Vec kn(mask ? k[i][t + 1] : 1.f);
      for (int64_t j = 0; j < H; j += W) {
        const int64_t c = std::min(W, H - j);
        Vec v = from_next ? Vec::loadu(dhi + j, c) * kn : Vec(0.f);
        if (has_g) v = v + Vec::loadu(gt + i * g_rs + j, c);
        Vec dpn = v * Vec::loadu(gi + 2 * H + j, c);
        (dpn * Vec::loadu(gi + j, c)).store(di + j, c);                       // d ghn
        (dpn * Vec::loadu(gi + 3 * H + j, c)).store(di + H + j, c);          // d r_pre
        (v * Vec::loadu(gi + 4 * H + j, c)).store(di + 2 * H + j, c);        // d z_pre
        dpn.store(di + 3 * H + j, c);                                        // d n_pre
        (v * Vec::loadu(gi + H + j, c)).store(dhi + j, c);                   // dh z
      }
      if (!dbacc.empty()) {
        float* acc = dbacc.data() + (i / nb) * 4 * H;
        for (int64_t j = 0; j < 4 * H; ++j) acc[j] += di[j];
      }
    }
    addmm_rows(dh, dgh, w_p);
    if (defined(dw_p)) {
      Tensor hp = t == 0 ? h0 : HS[t - 1];
      if (resets[t]) {
        mask_rows(hp, keep, t, hp_buf);
        hp = hp_buf;
      }
      wgrad_rows(dw_p, dgh, hp);
    }
    if (defined(dw_ih)) wgrad_rows(dw_ih, dgi, X[t]);
    if (defined(DX)) mm_rows(DX[t], dgi, w_ih);
  }
  if (!dbacc.empty()) db.add_(at::from_blob(dbacc.data(), db.sizes(), X.options()));
  if (t_len && resets[0]) {
    Tensor out = at::empty({n, H}, X.options());
    mask_rows(dh, keep, 0, out);
    return out;
  }
  return dh;
}

// -------------------------------------------------------------------------------------- LSTM

// Gates in the order (i, f, o, g). X [T, N, F]; HS, CS [T, N, H] (out, rows may be strided);
// A [T, N, 4H] activated gates, TC [T, N, H] tanh(c), HC [T, N, 2H] the reset states (h, c) *
// keep entering each step that resets: outputs, or all three empty (no grad); w_ih_t [F, 4H],
// w_hh_t [H, 4H], bias [4H] (b_ih + b_hh).
void lstm_forward(const Tensor& X, const Tensor& h0, const Tensor& c0, const Tensor& keep,
                  const Tensor& w_ih_t, const Tensor& w_hh_t, const Tensor& bias, const Tensor& HS,
                  const Tensor& CS, const Tensor& A, const Tensor& TC, const Tensor& HC) {
  check(X, "x"), check(h0, "h0"), check(c0, "c0"), check(HS, "hs"), check(CS, "cs");
  check(bias, "bias");
  const int64_t t_len = X.size(0), n = X.size(1), H = h0.size(1);
  const bool save = defined(A);
  const auto resets = reset_steps(keep);
  auto k = keep.accessor<float, 2>();
  Tensor s = at::empty({n, 4 * H}, X.options());
  Tensor hc_tmp = at::empty({n, 2 * H}, X.options());  // reset states without grad
  const float* b0 = bias.data_ptr<float>();
  const int64_t nb = block_rows(bias, n), bstep = bias_step(bias);
  Tensor hp = h0, cp = c0;
  auto reset_into = [&](int64_t t, const Tensor& h, const Tensor& c) {
    Tensor hc = save ? HC[t] : hc_tmp;
    Tensor hr = hc.narrow(1, 0, H), cr = hc.narrow(1, H, H);
    mask_rows(h, keep, t, hr);
    mask_rows(c, keep, t, cr);
    hp = hr, cp = cr;
  };
  if (t_len && resets[0]) reset_into(0, h0, c0);
  for (int64_t t = 0; t < t_len; ++t) {
    mm_rows(s, X[t], w_ih_t);
    addmm_rows(s, hp, w_hh_t);
    Tensor hs_t = HS[t], cs_t = CS[t];
    const float* sp = s.data_ptr<float>();
    float* ap = save ? A[t].data_ptr<float>() : nullptr;
    float* tcp = save ? TC[t].data_ptr<float>() : nullptr;
    const float* cpp = cp.data_ptr<float>();
    float* hsp = hs_t.data_ptr<float>();
    float* csp = cs_t.data_ptr<float>();
    const int64_t cp_rs = cp.stride(0), hs_rs = hs_t.stride(0), cs_rs = cs_t.stride(0);
    for (int64_t i = 0; i < n; ++i) {
      const float* b = b0 + (i / nb) * bstep;
      const float* si = sp + i * 4 * H;
      const float* ci = cpp + i * cp_rs;
      float* ai = save ? ap + i * 4 * H : nullptr;
      for (int64_t j = 0; j < H; j += W) {
        const int64_t c = std::min(W, H - j);
        Vec ig = sigmoid(Vec::loadu(si + j, c) + Vec::loadu(b + j, c));
        Vec fg = sigmoid(Vec::loadu(si + H + j, c) + Vec::loadu(b + H + j, c));
        Vec og = sigmoid(Vec::loadu(si + 2 * H + j, c) + Vec::loadu(b + 2 * H + j, c));
        Vec gg = tanh_(Vec::loadu(si + 3 * H + j, c) + Vec::loadu(b + 3 * H + j, c));
        Vec cn = fg * Vec::loadu(ci + j, c) + ig * gg;
        Vec tc = tanh_(cn);
        cn.store(csp + i * cs_rs + j, c);
        (og * tc).store(hsp + i * hs_rs + j, c);
        if (save) {
          ig.store(ai + j, c);
          fg.store(ai + H + j, c);
          og.store(ai + 2 * H + j, c);
          gg.store(ai + 3 * H + j, c);
          tc.store(tcp + i * H + j, c);
        }
      }
    }
    if (t + 1 < t_len) {
      if (resets[t + 1])
        reset_into(t + 1, hs_t, cs_t);
      else
        hp = hs_t, cp = cs_t;
    }
  }
}

// Returns (dh0, dc0). HS, CS [T, N, H] (the outputs, rows may be strided), X, A, TC, HC as
// saved by lstm_forward; gh, gc [T, N, H] output gradients (empty: unused); w_hh_p [4H, H],
// w_ih_p [4H, F] in (i, f, o, g) row order; DX, dw_ih, dw_hh, db outputs (empty: not wanted).
std::vector<Tensor> lstm_backward(const Tensor& X, const Tensor& HS, const Tensor& CS,
                                  const Tensor& A, const Tensor& TC, const Tensor& HC,
                                  const Tensor& h0, const Tensor& c0, const Tensor& keep,
                                  const Tensor& w_hh_p, const Tensor& w_ih_p, const Tensor& gh,
                                  const Tensor& gc, const Tensor& DX, const Tensor& dw_ih,
                                  const Tensor& dw_hh, const Tensor& db) {
  check(X, "x"), check(A, "A"), check(TC, "TC"), check(gh, "grad hs"), check(gc, "grad cs");
  const int64_t t_len = X.size(0), n = X.size(1), H = h0.size(1);
  const auto resets = reset_steps(keep);
  auto k = keep.accessor<float, 2>();
  const bool has_gh = defined(gh), has_gc = defined(gc);
  Tensor d = at::empty({n, 4 * H}, X.options());
  Tensor dh = at::zeros({n, H}, X.options()), dc = at::zeros({n, H}, X.options());
  std::vector<float> dbacc(defined(db) ? db.numel() : 0, 0.f);
  const int64_t nb = defined(db) && db.dim() == 2 ? n / db.size(0) : n;
  float* dp = d.data_ptr<float>();
  float* dhp = dh.data_ptr<float>();
  float* dcp = dc.data_ptr<float>();
  for (int64_t t = t_len - 1; t >= 0; --t) {
    Tensor hp, cp;
    if (resets[t]) {
      hp = HC[t].narrow(1, 0, H), cp = HC[t].narrow(1, H, H);
    } else if (t == 0) {
      hp = h0, cp = c0;
    } else {
      hp = HS[t - 1], cp = CS[t - 1];
    }
    // the state gradients (dh, dc) arriving from step t + 1 are w.r.t. its reset state
    const bool mask = t + 1 < t_len && resets[t + 1];
    const float* ght = has_gh ? gh.data_ptr<float>() + t * gh.stride(0) : nullptr;
    const float* gct = has_gc ? gc.data_ptr<float>() + t * gc.stride(0) : nullptr;
    const int64_t gh_rs = has_gh ? gh.stride(1) : 0, gc_rs = has_gc ? gc.stride(1) : 0;
    const float* ap = A[t].data_ptr<float>();
    const float* tcp = TC[t].data_ptr<float>();
    const float* cpp = cp.data_ptr<float>();
    const int64_t cp_rs = cp.stride(0);
    const Vec one(1.f);
    for (int64_t i = 0; i < n; ++i) {
      const float* ai = ap + i * 4 * H;
      const float* tci = tcp + i * H;
      const float* ci = cpp + i * cp_rs;
      float* di = dp + i * 4 * H;
      float* dhi = dhp + i * H;
      float* dci = dcp + i * H;
      const Vec kn(mask ? k[i][t + 1] : 1.f);
      for (int64_t j = 0; j < H; j += W) {
        const int64_t c = std::min(W, H - j);
        Vec vh = Vec::loadu(dhi + j, c) * kn, vc = Vec::loadu(dci + j, c) * kn;
        if (has_gh) vh = vh + Vec::loadu(ght + i * gh_rs + j, c);
        if (has_gc) vc = vc + Vec::loadu(gct + i * gc_rs + j, c);
        Vec ig = Vec::loadu(ai + j, c), fg = Vec::loadu(ai + H + j, c);
        Vec og = Vec::loadu(ai + 2 * H + j, c), gg = Vec::loadu(ai + 3 * H + j, c);
        Vec tc = Vec::loadu(tci + j, c);
        vc = vc + vh * og * (one - tc * tc);
        (ig * (one - ig) * vc * gg).store(di + j, c);
        (fg * (one - fg) * vc * Vec::loadu(ci + j, c)).store(di + H + j, c);
        (og * (one - og) * vh * tc).store(di + 2 * H + j, c);
        ((one - gg * gg) * ig * vc).store(di + 3 * H + j, c);
        (vc * fg).store(dci + j, c);
      }
      if (!dbacc.empty()) {
        float* acc = dbacc.data() + (i / nb) * 4 * H;
        for (int64_t j = 0; j < 4 * H; ++j) acc[j] += di[j];
      }
    }
    mm_rows(dh, d, w_hh_p);
    if (defined(dw_hh)) wgrad_rows(dw_hh, d, hp);
    if (defined(dw_ih)) wgrad_rows(dw_ih, d, X[t]);
    if (defined(DX)) mm_rows(DX[t], d, w_ih_p);
  }
  if (!dbacc.empty()) db.add_(at::from_blob(dbacc.data(), db.sizes(), X.options()));
  if (t_len && resets[0]) {
    Tensor oh = at::empty({n, H}, X.options()), oc = at::empty({n, H}, X.options());
    mask_rows(dh, keep, 0, oh);
    mask_rows(dc, keep, 0, oc);
    return {oh, oc};
  }
  return {dh, dc};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gru_forward", &gru_forward);
  m.def("gru_backward", &gru_backward);
  m.def("lstm_forward", &lstm_forward);
  m.def("lstm_backward", &lstm_backward);
}
