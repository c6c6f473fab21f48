"""ConvS2S decoder-step Triton kernel: linearized causal convolution + bias + GLU [+ residual, ·√0.5] in one pass.

A decoder step of a causal width-k convolution is one matrix product (fairseq calls it a linearized
convolution): the row for new step i of batch b is the span x[b, i : i+k, :] of the buffered window, which is
contiguous (k·C_in elements from (b·W + i)·C_in), so the reduction runs over that flat span against a weight
laid out (2·C_out, k·C_in) with column j·C_in + c. Each program owns BLOCK_N output channels and keeps both
GLU halves (value columns o, gate columns C_out + o) in two fp32 accumulators, so the gate is applied in
registers and only C_out values are stored. The residual is added here only where it follows the GLU
directly (ConvS2S blocks without attention); in attending decoder blocks attention sits between the two.
"""

import triton
import triton.language as tl


@triton.jit
def convs2s_step_kernel(
    x_ptr, w_ptr, b_ptr, r_ptr, y_ptr,
    M, N_NEW, W_LEN, C_IN, C_OUT, KC, res_scale,
    HAS_RESIDUAL: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Row r = b·N_NEW + i, taps[r, q] = x_flat[(b·W_LEN + i)·C_IN + q] for q < KC = k·C_IN:
    y[r, o] = (taps·w[o] + bias[o]) · σ(taps·w[C_OUT + o] + bias[C_OUT + o]), then (y + res[r, o])·res_scale.

    UPCAST: load-and-upcast to fp32 before tl.dot (fp32 inputs, and always under the interpreter, whose
    fp16/bf16 dot does not accumulate in fp32); otherwise fp16/bf16 tensor-core dots with fp32 accumulators.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    # start of each row's tap span: new step i of batch b sits at window rows i .. i + k - 1
    span = ((rows64 // N_NEW) * W_LEN + rows64 % N_NEW) * C_IN
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < C_OUT
    w_val = cols.to(tl.int64) * KC
    w_gate = (cols + C_OUT).to(tl.int64) * KC
    acc_a = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for q0 in range(0, KC, BLOCK_K):
        q = q0 + tl.arange(0, BLOCK_K)
        q_ok = q < KC
        a = tl.load(x_ptr + span[:, None] + q[None, :], mask=row_ok[:, None] & q_ok[None, :], other=0.0)
        w_mask = q_ok[:, None] & col_ok[None, :]
        wa = tl.load(w_ptr + w_val[None, :] + q[:, None], mask=w_mask, other=0.0)  # (BLOCK_K, BLOCK_N)
        wg = tl.load(w_ptr + w_gate[None, :] + q[:, None], mask=w_mask, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            wa = wa.to(tl.float32)
            wg = wg.to(tl.float32)
        acc_a = tl.dot(a, wa, acc_a, input_precision="ieee")
        acc_g = tl.dot(a, wg, acc_g, input_precision="ieee")
    bias_a = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    bias_g = tl.load(b_ptr + C_OUT + cols, mask=col_ok, other=0.0).to(tl.float32)
    out = (acc_a + bias_a[None, :]) * tl.sigmoid(acc_g + bias_g[None, :])
    out_off = rows64[:, None] * C_OUT + cols[None, :]
    out_mask = row_ok[:, None] & col_ok[None, :]
    if HAS_RESIDUAL:
        res = tl.load(r_ptr + out_off, mask=out_mask, other=0.0).to(tl.float32)
        out = (out + res) * res_scale
    tl.store(y_ptr + out_off, out.to(y_ptr.dtype.element_ty), mask=out_mask)
