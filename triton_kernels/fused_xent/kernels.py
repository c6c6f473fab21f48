"""Fused output projection + label-smoothed cross-entropy: logits = features @ weight.T never reach memory.

Forward: each program owns BLOCK_M rows and walks the vocabulary in BLOCK_V tiles, keeping an online
max / sum-exp (the log-sum-exp), the target logit and the sum of logits per row. Backward recomputes the
logit tiles from the stored per-row lse. Grid of the backward kernels: (row or vocab blocks) x (BLOCK_D
channel blocks of the gradient), so each program keeps a (rows, BLOCK_D) fp32 accumulator instead of a
full-width one; the price is recomputing the logit tile once per channel block.

dlogits[r, v] = g_loss[r] * (p - a*[v = t] - eps_i) + g_nll[r] * (p - [v = t]), a = 1 - eps - eps_i,
which is the derivative of loss = a*nll + eps_i * sum_v(-log p_v) (the p coefficient a + V*eps_i is 1).
"""

import triton
import triton.language as tl


@triton.jit
def _logits_tile(f_ptr, w_ptr, rows64, row_ok, cols64, col_ok, C,
                 UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    """(BLOCK_M, BLOCK_V) fp32 logits for the given rows and vocabulary entries (zero outside the masks)."""
    acc = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
    for k0 in range(0, C, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < C
        a = tl.load(f_ptr + rows64[:, None] * C + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + cols64[None, :] * C + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    return acc


@triton.jit
def _dlogits(z, lse, tgt, g_loss, g_nll, keep, cols, col_ok, smooth_coef, eps_i):
    """Gradient of the per-row (loss, nll) wrt the logit tile z; zero at pads, rows and columns out of range."""
    p = tl.exp(z - lse[:, None])
    hit = (cols[None, :] == tgt[:, None]).to(tl.float32)
    dz = (g_loss + g_nll)[:, None] * p - (g_loss * smooth_coef + g_nll)[:, None] * hit - (g_loss * eps_i)[:, None]
    return tl.where(keep[:, None] & col_ok[None, :], dz, 0.0)


@triton.jit
def _row_terms(t_ptr, lse_ptr, gl_ptr, gn_ptr, rows, N, ignore_index):
    """Per-row inputs of the backward: target, non-pad mask, stored lse, the two upstream gradients."""
    row_ok = rows < N
    tgt = tl.load(t_ptr + rows, mask=row_ok, other=ignore_index).to(tl.int32)
    keep = row_ok & (tgt != ignore_index)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    g_loss = tl.load(gl_ptr + rows, mask=keep, other=0.0)
    g_nll = tl.load(gn_ptr + rows, mask=keep, other=0.0)
    return row_ok, tgt, keep, lse, g_loss, g_nll


@triton.jit
def fused_xent_fwd_kernel(
    f_ptr, w_ptr, t_ptr, lse_ptr, loss_ptr, nll_ptr,
    N, V, C, ignore_index, smooth_coef, eps_i,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Per row r: lse[r]; loss[r] = a*nll + eps_i*(V*lse - sum_v z), nll[r] = lse - z[t] (both 0 at pads)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < N
    rows64 = rows.to(tl.int64)
    tgt = tl.load(t_ptr + rows, mask=row_ok, other=ignore_index).to(tl.int32)
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    s = tl.zeros([BLOCK_M], dtype=tl.float32)
    z_t = tl.zeros([BLOCK_M], dtype=tl.float32)
    z_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        z = _logits_tile(f_ptr, w_ptr, rows64, row_ok, cols.to(tl.int64), col_ok, C,
                         UPCAST, BLOCK_M, BLOCK_V, BLOCK_K)
        z_t += tl.sum(tl.where(cols[None, :] == tgt[:, None], z, 0.0), axis=1)
        z_sum += tl.sum(tl.where(col_ok[None, :], z, 0.0), axis=1)
        z = tl.where(col_ok[None, :], z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, axis=1))  # finite: every tile has a valid column
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new[:, None]), axis=1)
        m = m_new
    lse = m + tl.log(s)
    keep = row_ok & (tgt != ignore_index)
    nll = tl.where(keep, lse - z_t, 0.0)
    loss = tl.where(keep, smooth_coef * nll + eps_i * (V * lse - z_sum), 0.0)
    tl.store(lse_ptr + rows, lse, mask=row_ok)
    tl.store(loss_ptr + rows, loss, mask=row_ok)
    tl.store(nll_ptr + rows, nll, mask=row_ok)


@triton.jit
def fused_xent_bwd_features_kernel(
    f_ptr, w_ptr, t_ptr, lse_ptr, gl_ptr, gn_ptr, df_ptr,
    N, V, C, ignore_index, smooth_coef, eps_i,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """df[rows, d-block] = sum over vocabulary tiles of dlogits @ weight[tile, d-block]."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < C
    rows64 = rows.to(tl.int64)
    row_ok, tgt, keep, lse, g_loss, g_nll = _row_terms(t_ptr, lse_ptr, gl_ptr, gn_ptr, rows, N, ignore_index)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        cols64 = cols.to(tl.int64)
        z = _logits_tile(f_ptr, w_ptr, rows64, row_ok, cols64, col_ok, C, UPCAST, BLOCK_M, BLOCK_V, BLOCK_K)
        dz = _dlogits(z, lse, tgt, g_loss, g_nll, keep, cols, col_ok, smooth_coef, eps_i)
        w = tl.load(w_ptr + cols64[:, None] * C + d[None, :], mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            w = w.to(tl.float32)
        acc = tl.dot(dz.to(w.dtype), w, acc, input_precision="ieee")
    out = df_ptr + rows64[:, None] * C + d[None, :]
    tl.store(out, acc.to(df_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def fused_xent_bwd_weight_kernel(
    f_ptr, w_ptr, t_ptr, lse_ptr, gl_ptr, gn_ptr, dw_ptr,
    N, V, C, ignore_index, smooth_coef, eps_i,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """dw[v-block, d-block] = sum over row tiles of dlogits.T @ features[tile, d-block] (no atomics)."""
    cols = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < V
    d_ok = d < C
    cols64 = cols.to(tl.int64)
    acc = tl.zeros([BLOCK_V, BLOCK_D], dtype=tl.float32)
    for r0 in range(0, N, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        rows64 = rows.to(tl.int64)
        row_ok, tgt, keep, lse, g_loss, g_nll = _row_terms(t_ptr, lse_ptr, gl_ptr, gn_ptr, rows, N, ignore_index)
        z = _logits_tile(f_ptr, w_ptr, rows64, row_ok, cols64, col_ok, C, UPCAST, BLOCK_M, BLOCK_V, BLOCK_K)
        dz = _dlogits(z, lse, tgt, g_loss, g_nll, keep, cols, col_ok, smooth_coef, eps_i)
        f = tl.load(f_ptr + rows64[:, None] * C + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            f = f.to(tl.float32)
        acc = tl.dot(tl.trans(dz.to(f.dtype)), f, acc, input_precision="ieee")
    out = dw_ptr + cols64[:, None] * C + d[None, :]
    tl.store(out, acc.to(dw_ptr.dtype.element_ty), mask=col_ok[:, None] & d_ok[None, :])
