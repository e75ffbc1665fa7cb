#!/usr/bin/python3
"""A second, independent oracle for DeepSeek-V4 and V4.1 (issue 28): numpy.

Written from the official inference code's semantics, not from strata's C
code nor from the model document:
  - V4: inference/model.py, upstream deepseek-ai/DeepSeek-V4-Flash commit
    60d8d70 (index file id 70831076062), and its kernel.py's act_quant /
    fp4_act_quant / fp8_gemm / fp4_gemm / sparse_attn / hc_split_sinkhorn
    (the fp4 note, id 60864417075; the vendored kernel.py, id 60445807715);
  - V4.1 (the official model.py could not be read): ATOM's V4.1 eager
    reference (id 66772560054) and the published port of V4.1's model.py
    (id 68851935069); see the V4.1 section below.
Each function or class below names the official one it follows.

All arithmetic is float64 except the quantization round trips the official
code applies (its "QAT" simulation and its FP8/FP4 linears), which are
computed exactly as the kernels define them:
  - act_quant(..., inplace=True): FP8 E4M3 with a power-of-two (ue8m0) scale
    per block: V4 on the window / compressed KV's non-rope dims (blocks of
    64), V4.1 on the whole window row (blocks of 32); on the input of every
    linear whose weight is FP8 or FP4 (official `linear`: blocks of 128 in
    V4, of the weight block's width, 32, in V4.1);
  - fp4_act_quant(..., inplace=True): E2M1 per 32 with a power-of-two
    scale: V4 after the Hadamard rotation on the indexer's q and keys, V4.1
    on its indexer's q and keys (no rotation);
  - V4.1's compressed KV: E2M1 per 16 with an E4M3 scale.
The official code keeps BF16 activations between ops; this oracle does not
(float64 throughout), the one deliberate difference (docs/DESIGN.md, "A
second oracle").

Adaptation to the tiny fixtures: the official `block_size` (128) and the KV
block (64) assert that the width divides; the tiny model's widths (32, 48,
64, 80, 96) are below them, so a block is min(block, width) there: one
block per row (a kernel over ceildiv(N, block) blocks with a partial last
block gives the same).  Weight dequantisation uses the checkpoint's
`weight_block_size`.

Usage:
  scripts/dsv-oracle.py MODEL_DIR OUT.json [--cases a,b,...] [--steps N]
      [--exact | --no-act-trip] [--decode-all]
MODEL_DIR holds config.json, model.safetensors, reference.json (the case
ids are taken from there; the oracle never reads the reference's logits)
and, for V4.1, engram_hash.json.  --exact and --no-act-trip are checks of
the oracle against the fixtures' own references (docs/DESIGN.md), not the
official math.  Needs Debian's python3 and python3-numpy only.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

# ---------------------------------------------------------------------------
# safetensors and the checkpoint's number formats
# ---------------------------------------------------------------------------


def e4m3_table():
    """Value of each FP8 E4M3FN byte (1 sign, 4 exponent bits, bias 7, 3
    mantissa bits; 0x7F/0xFF are NaN, no infinities)."""
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * m * 2.0 ** -9
        else:
            t[b] = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


E4M3 = e4m3_table()
# E2M1 nibble values (bit 3 = sign): kernel.py / convert.py FP4_TABLE.
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


class SafeTensors:
    """Reads one .safetensors file: 8-byte little-endian header length, a JSON
    header {name: {dtype, shape, data_offsets}}, then the data."""

    def __init__(self, path):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            self.header = json.loads(f.read(n))
        self.base = 8 + n
        self.data = np.memmap(path, dtype=np.uint8, mode="r")

    def has(self, name):
        return name in self.header

    def raw(self, name):
        h = self.header[name]
        a, b = h["data_offsets"]
        return h["dtype"], h["shape"], self.data[self.base + a:self.base + b]

    def get(self, name):
        """The tensor as float64 (I64 as int64; F8_E4M3 as the code values
        without scale; F8_E8M0 as powers of two)."""
        dt, shape, buf = self.raw(name)
        if dt == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            return u.view(np.float32).astype(np.float64).reshape(shape)
        if dt == "F32":
            return np.frombuffer(buf, dtype="<f4").astype(np.float64).reshape(shape)
        if dt == "I64":
            return np.frombuffer(buf, dtype="<i8").reshape(shape)
        if dt == "F8_E4M3":
            return E4M3[np.frombuffer(buf, dtype=np.uint8)].reshape(shape)
        if dt == "F8_E8M0":
            b = np.frombuffer(buf, dtype=np.uint8).astype(np.float64)
            if (b == 255).any():
                raise ValueError(f"{name}: E8M0 NaN code 0xFF")
            return np.exp2(b - 127.0).reshape(shape)
        if dt == "I8":
            return np.frombuffer(buf, dtype=np.uint8).reshape(shape)
        raise ValueError(f"{name}: dtype {dt} not handled")


def load_weight(st, name, m):
    """A linear's logical [out, in] float64 weight.
    FP8 (official Linear with float8_e4m3fn): W = e4m3 * 2^(scale - 127) per
    m.wblock block (the checkpoint's weight_block_size).  FP4
    (float4_e2m1fn_x2, stored as I8 [out, in/2]): byte k holds element 2k in
    the low nibble, 2k+1 in the high one (cast_e2m1fn_to_e4m3fn), times the
    E8M0 scale per 32 inputs.  BF16/F32: as stored.  Returns (W, kind,
    act_block): kind 'fp8', 'fp4' or 'dense' (the official `linear` applies
    act_quant to the input of 'fp8' and 'fp4' weights only), act_block the
    model's block for that trip (m.act_block)."""
    wblock = m.wblock
    dt = st.raw(name + ".weight")[0]
    if dt == "F8_E4M3":
        w = st.get(name + ".weight")
        s = st.get(name + ".scale")
        s = np.repeat(np.repeat(s, wblock[0], axis=0), wblock[1], axis=1)
        return w * s[:w.shape[0], :w.shape[1]], "fp8", m.act_block
    if dt == "I8":
        p = st.get(name + ".weight")
        out, half = p.shape
        w = np.empty((out, half * 2))
        w[:, 0::2] = E2M1[p & 0xF]
        w[:, 1::2] = E2M1[p >> 4]
        s = np.repeat(st.get(name + ".scale"), 32, axis=1)
        return w * s, "fp4", m.act_block
    return st.get(name + ".weight"), "dense", m.act_block


# ---------------------------------------------------------------------------
# kernel.py: the quantization round trips
# ---------------------------------------------------------------------------


# Knife edges.  A value that lies within float32 rounding of a rounding
# midpoint (or a scale's power-of-two boundary, or a top-k boundary) may be
# decided the other way by a float32 implementation.  While the driver
# evaluates one position (CUR_POS), the smallest relative distance to such a
# boundary met there is kept in MARGINS[pos]; the JSON lists the positions
# whose margin is below FRAGILE_RECORD, so that a test can tell a float32
# rounding flip from a semantic difference.
MARGINS = {}
CUR_POS = None
FRAGILE_RECORD = 1e-5


def note_margin(rel):
    """Records the smallest relative margin in rel (array or float) for the
    position being evaluated (nothing outside a one-position evaluation).
    A margin of exactly 0 is an exact input (e.g. an FP8 table row's amax of
    448 x 2^k, two ReLU-clipped scores of 0), which float32 gets exactly too:
    not a knife edge, not recorded."""
    if CUR_POS is None:
        return
    rel = np.asarray(rel, dtype=np.float64)
    rel = rel[rel > 0]
    if rel.size:
        MARGINS[CUR_POS] = min(MARGINS.get(CUR_POS, 1.0), float(rel.min()))


def round_to_grid(v, man_bits, min_exp):
    """Round-to-nearest-even of v onto a float format with `man_bits` mantissa
    bits whose smallest normal exponent is `min_exp` (subnormals below it).
    Inputs are already clamped to the format's max (kernels clamp first)."""
    a = np.abs(v)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.maximum(e, min_exp)
    q = np.exp2(e - man_bits)
    if CUR_POS is not None:
        frac = v / q - np.floor(v / q)
        note_margin((np.abs(frac - 0.5) * q / np.where(a > 0, a, np.inf))[a > 0])
    return np.round(v / q) * q  # np.round rounds half to even


def e4m3_round(v):
    """T.Cast(FP8 e4m3, v) for |v| <= 448: RNE, normals from 2^-6."""
    return round_to_grid(v, 3, -6)


def e2m1_round(v):
    """T.Cast(FP4 e2m1, v) for |v| <= 6: RNE onto 0, .5, 1, 1.5, 2, 3, 4, 6."""
    return round_to_grid(v, 1, 0)


def pow2_scale(amax, fmt_max_inv):
    """fast_round_scale(amax, fmt_max_inv) = 2^ceil(log2(amax * fmt_max_inv)),
    computed as the kernel does on float32 bits (fast_log2_ceil: exponent, +1
    when any mantissa bit is set; fast_pow2)."""
    if CUR_POS is not None:
        l2 = np.log2(np.asarray(amax, dtype=np.float64) * fmt_max_inv)
        note_margin(np.abs(l2 - np.round(l2)) * math.log(2))
    p = (np.asarray(amax, dtype=np.float32) * np.float32(fmt_max_inv)).astype(np.float32)
    bits = p.view(np.uint32)
    ex = ((bits >> 23) & 0xFF).astype(np.int64) - 127
    ex += ((bits & 0x7FFFFF) != 0).astype(np.int64)
    return np.exp2(ex.astype(np.float64))


def blocks(x, block):
    """View the last dim as [n, block] with block = min(block, width) (see
    the module doc on the tiny widths)."""
    n = x.shape[-1]
    b = min(block, n)
    if n % b:
        raise ValueError(f"width {n} is not a multiple of the block {b}")
    return x.reshape(x.shape[:-1] + (n // b, b))


# --exact (a check of the oracle, not its output): every round trip off.
ROUND_TRIPS = True
# --no-act-trip (a check of the oracle): the KV / indexer trips only, the
# set the V4.1 fixture's reference.json applies.
ACT_TRIP = True


def act_quant(x, block):
    """kernel.py act_quant(x, block, scale_fmt='ue8m0', inplace=True): per
    block amax (at least 1e-4), s = fast_round_scale(amax, 1/448),
    x <- e4m3(clamp(x / s, -448, 448)) * s.  Also the input side of
    fp8_gemm/fp4_gemm (the GEMM of the quantized input times the dequantized
    weight equals this round trip followed by a plain product)."""
    if not ROUND_TRIPS:
        return x
    xb = blocks(x, block)
    amax = np.maximum(np.abs(xb).max(axis=-1, keepdims=True), 1e-4)
    s = pow2_scale(amax, 1.0 / 448.0)
    y = e4m3_round(np.clip(xb / s, -448.0, 448.0)) * s
    return y.reshape(x.shape)


def fp4_act_quant(x, block=32):
    """kernel.py fp4_act_quant(x, 32, inplace=True): per block amax (at least
    6 * 2^-126), s = fast_round_scale(amax, 1/6), x <- e2m1(clamp(x/s, -6, 6)) * s."""
    if not ROUND_TRIPS:
        return x
    xb = blocks(x, block)
    amax = np.maximum(np.abs(xb).max(axis=-1, keepdims=True), 6.0 * 2.0 ** -126)
    s = pow2_scale(amax, 1.0 / 6.0)
    y = e2m1_round(np.clip(xb / s, -6.0, 6.0)) * s
    return y.reshape(x.shape)


def hadamard_matrix(n):
    """Sylvester Hadamard matrix H_n (fast_hadamard_transform's ordering)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    if h.shape[0] != n:
        raise ValueError(f"Hadamard size {n} is not a power of two")
    return h


def rotate_activation(x):
    """model.py rotate_activation: hadamard_transform(x, scale=d^-0.5)."""
    d = x.shape[-1]
    return x @ hadamard_matrix(d).T * d ** -0.5


# ---------------------------------------------------------------------------
# model.py building blocks
# ---------------------------------------------------------------------------


def linear(x, wk):
    """model.py linear: FP8/FP4 weight -> act_quant(x, block_size) then the
    GEMM; a BF16/F32 weight -> a plain product."""
    w, kind, act_block = wk
    if kind in ("fp8", "fp4") and ACT_TRIP:
        x = act_quant(x, act_block)
    return x @ w.T


def rms_norm(x, w, eps):
    """model.py RMSNorm.forward: x * rsqrt(mean(x^2) + eps) * weight."""
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def precompute_freqs(dim, original_seq_len, base, factor, beta_fast, beta_slow):
    """model.py precompute_freqs_cis: the per-pair inverse frequencies, with
    YaRN's ramp when original_seq_len > 0 (angles are p * freqs)."""
    def corr_dim(num_rot):
        return dim * math.log(original_seq_len / (num_rot * 2 * math.pi)) / (2 * math.log(base))

    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if original_seq_len > 0:
        low = max(math.floor(corr_dim(beta_fast)), 0)
        high = min(math.ceil(corr_dim(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    return freqs


def apply_rotary(x, pos, freqs, inverse=False):
    """model.py apply_rotary_emb on the last 2*len(freqs) dims of x: pairs
    (2i, 2i+1) as complex numbers times e^{+-i p f_i}; x's leading axis is
    position when pos is an array (broadcast over heads)."""
    rd = 2 * len(freqs)
    ang = np.outer(np.atleast_1d(pos), freqs)  # [s, rd/2]
    if inverse:
        ang = -ang
    c, s = np.cos(ang), np.sin(ang)
    y = x.copy()
    re = x[..., -rd::2]
    im = x[..., -rd + 1::2]
    shape = (ang.shape[0],) + (1,) * (x.ndim - 2) + (ang.shape[1],)
    c, s = c.reshape(shape), s.reshape(shape)
    y[..., -rd::2] = re * c - im * s
    y[..., -rd + 1::2] = re * s + im * c
    return y


def sparse_attn(q, kv, sink, idxs, scale):
    """kernel.py sparse_attn for one query position: q [H, d], kv [n, d]
    (K = V), idxs the selected rows (-1 = none).  softmax over the selected
    scores with the per-head sink added to the denominator only."""
    sel = np.array([i for i in idxs if i >= 0], dtype=np.int64)
    k = kv[sel]
    sc = (q @ k.T) * scale  # [H, t]
    m = sc.max(axis=1)
    e = np.exp(sc - m[:, None])
    den = e.sum(axis=1) + np.exp(sink - m)
    return (e @ k) / den[:, None]


# ---------------------------------------------------------------------------
# Compressor, Indexer, Attention (model.py)
# ---------------------------------------------------------------------------


class Compressor:
    """model.py Compressor: gated pooling of `ratio` consecutive tokens into
    one KV row; ratio 4 overlaps (each row also pools the previous chunk with
    the first half of the projections).  Holds its own decode state
    (kv_state, score_state) and writes rows into `cache` (a list)."""

    def __init__(self, m, prefix, ratio, head_dim, rotate, freqs):
        self.m, self.ratio, self.d, self.rotate, self.freqs = m, ratio, head_dim, rotate, freqs
        self.overlap = ratio == 4
        coff = 1 + self.overlap
        st = m.st
        self.ape = st.get(prefix + ".ape")  # [ratio, coff*d]
        self.wkv = load_weight(st, prefix + ".wkv", m)
        self.wgate = load_weight(st, prefix + ".wgate", m)
        self.norm = st.get(prefix + ".norm.weight")
        self.kv_state = np.zeros((coff * ratio, coff * head_dim))
        self.score_state = np.full((coff * ratio, coff * head_dim), -np.inf)
        self.cache = []

    def overlap_transform(self, t, value):
        """[n, r, 2d] -> [n, 2r, d]: rows r.. = this chunk's second half,
        rows ..r = the previous chunk's first half (value for chunk 0)."""
        n, r, d = t.shape[0], self.ratio, self.d
        out = np.full((n, 2 * r, d), value)
        out[:, r:] = t[:, :, d:]
        out[1:, :r] = t[:-1, :, :d]
        return out

    def forward(self, x, start_pos):
        """x: [s, dim] (the attention's normed input).  Returns the new rows
        ([n, d]) or None, and appends them to self.cache."""
        ratio, d, m = self.ratio, self.d, self.m
        seqlen = x.shape[0]
        kv = linear(x, self.wkv)  # BF16 weights: no act_quant
        score = linear(x, self.wgate)
        if start_pos == 0:
            should = seqlen >= ratio
            rem = seqlen % ratio
            cutoff = seqlen - rem
            offset = ratio if self.overlap else 0
            if self.overlap and cutoff >= ratio:
                self.kv_state[:ratio] = kv[cutoff - ratio:cutoff]
                self.score_state[:ratio] = score[cutoff - ratio:cutoff] + self.ape
            if rem > 0:
                self.kv_state[offset:offset + rem] = kv[cutoff:]
                self.score_state[offset:offset + rem] = score[cutoff:] + self.ape[:rem]
            kv = kv[:cutoff].reshape(-1, ratio, kv.shape[-1])
            score = score[:cutoff].reshape(-1, ratio, score.shape[-1]) + self.ape
            if self.overlap:
                kv = self.overlap_transform(kv, 0.0)
                score = self.overlap_transform(score, -np.inf)
            kv = (kv * softmax(score, axis=1)).sum(axis=1)
            pos = np.arange(0, cutoff, ratio)
        else:
            should = (start_pos + 1) % ratio == 0
            score = score[0] + self.ape[start_pos % ratio]
            if self.overlap:
                self.kv_state[ratio + start_pos % ratio] = kv[0]
                self.score_state[ratio + start_pos % ratio] = score
                if should:
                    ks = np.concatenate([self.kv_state[:ratio, :d], self.kv_state[ratio:, d:]])
                    ss = np.concatenate([self.score_state[:ratio, :d], self.score_state[ratio:, d:]])
                    kv = (ks * softmax(ss, axis=0)).sum(axis=0, keepdims=True)
                    self.kv_state[:ratio] = self.kv_state[ratio:]
                    self.score_state[:ratio] = self.score_state[ratio:]
            else:
                self.kv_state[start_pos % ratio] = kv[0]
                self.score_state[start_pos % ratio] = score
                if should:
                    kv = (self.kv_state * softmax(self.score_state, axis=0)).sum(axis=0, keepdims=True)
            pos = np.array([start_pos + 1 - ratio])
        if not should:
            return None
        kv = rms_norm(kv, self.norm, m.eps)
        kv = apply_rotary(kv, pos, self.freqs)
        if self.rotate:
            kv = fp4_act_quant(rotate_activation(kv), 32)
        else:
            rd = m.rd
            kv[:, :-rd] = act_quant(kv[:, :-rd], 64)
        self.cache.extend(list(kv))
        return kv


def topk_margin(scores, k):
    """Records the relative gap between the k-th and (k+1)-th of scores (a
    selection a float32 implementation may make the other way)."""
    f = np.sort(np.asarray(scores)[np.isfinite(scores)])[::-1]
    if CUR_POS is not None and 0 < k < len(f):
        note_margin(abs(f[k - 1] - f[k]) / max(abs(f[k - 1]), abs(f[k]), 1e-30))


def softmax(x, axis):
    mx = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - mx)
    return e / e.sum(axis=axis, keepdims=True)


class Indexer:
    """model.py Indexer: scores every visible compressed row with ReLU'd,
    weighted multi-head dot products of Hadamard-rotated, FP4-simulated q and
    keys (its own rotate=True Compressor) and keeps the top index_topk."""

    def __init__(self, m, prefix, ratio, freqs):
        c = m.cfg
        self.m, self.ratio, self.freqs = m, ratio, freqs
        self.n_heads, self.hd = c["index_n_heads"], c["index_head_dim"]
        self.topk = c["index_topk"]
        self.wq_b = load_weight(m.st, prefix + ".wq_b", m)
        self.weights_proj = load_weight(m.st, prefix + ".weights_proj", m)
        self.compressor = Compressor(m, prefix + ".compressor", ratio, self.hd, True, freqs)

    def forward(self, x, qr, start_pos):
        """Returns, per query position, the selected compressed-row indices
        (row numbers, no offset; -1 = none)."""
        s = x.shape[0]
        ratio = self.ratio
        end = start_pos + s
        pos = np.arange(start_pos, end)
        q = linear(qr, self.wq_b).reshape(s, self.n_heads, self.hd)
        q = apply_rotary(q, pos, self.freqs)
        q = fp4_act_quant(rotate_activation(q), 32)
        self.compressor.forward(x, start_pos)
        w = linear(x, self.weights_proj) * (self.hd ** -0.5 * self.n_heads ** -0.5)
        n = end // ratio
        keys = np.array(self.compressor.cache[:n]).reshape(n, self.hd)
        sc = np.einsum("shd,td->sht", q, keys)
        sc = (np.maximum(sc, 0) * w[:, :, None]).sum(axis=1)  # [s, n]
        out = []
        k = min(self.topk, n)
        for i in range(s):
            visible = (start_pos + i + 1) // ratio
            row = sc[i].copy()
            row[visible:] = -np.inf
            top = np.argsort(-row, kind="stable")[:k]
            topk_margin(row, k)
            out.append([int(t) if t < visible else -1 for t in top])
        return out


def attn_weights(a, m, layer, prefix=None):
    """The weights and shapes both revisions' Attention.__init__ load alike
    (model.py Attention.__init__: wq_a, q_norm, wq_b, wkv, kv_norm, wo_a in
    dtype=bfloat16, wo_b, attn_sink), set on a; returns (cfg, tensors,
    prefix).  prefix: the block's tensor prefix (default layers.N; the MTP
    block's is mtp.K, its layer_id n_layers + K)."""
    c, st = m.cfg, m.st
    p = (prefix or f"layers.{layer}") + ".attn"
    a.m = m
    a.ratio = c["compress_ratios"][layer]
    a.n_heads, a.hd = c["num_attention_heads"], c["head_dim"]
    a.groups, a.o_rank = c["o_groups"], c["o_lora_rank"]
    a.win = c["sliding_window"]
    a.sink = st.get(p + ".attn_sink")
    a.wq_a = load_weight(st, p + ".wq_a", m)
    a.q_norm = st.get(p + ".q_norm.weight")
    a.wq_b = load_weight(st, p + ".wq_b", m)
    a.wkv = load_weight(st, p + ".wkv", m)
    a.kv_norm = st.get(p + ".kv_norm.weight")
    a.wo_a = load_weight(st, p + ".wo_a", m)[0]
    a.wo_b = load_weight(st, p + ".wo_b", m)
    a.scale = a.hd ** -0.5
    return c, st, p


class Attention:
    """model.py Attention: low-rank q (wq_a, q_norm, wq_b, per-head RMS),
    one K=V latent (wkv, kv_norm, RoPE, FP8 non-rope dims) over a sliding
    window plus, when compress_ratio > 0, compressed rows (all visible ones,
    or the indexer's top-k for ratio 4); sink softmax; inverse RoPE on the
    output; grouped wo_a (BF16 einsum, no act_quant) and wo_b."""

    def __init__(self, m, layer, prefix=None):
        c, st, p = attn_weights(self, m, layer, prefix)
        # compress layers: compress_rope_theta with YaRN; window-only: rope_theta, no YaRN
        if self.ratio:
            self.freqs = precompute_freqs(m.rd, m.original_seq_len, m.compress_theta,
                                          m.rope_factor, m.beta_fast, m.beta_slow)
            self.compressor = Compressor(m, p + ".compressor", self.ratio, self.hd, False, self.freqs)
            self.indexer = Indexer(m, p + ".indexer", self.ratio, self.freqs) if self.ratio == 4 else None
        else:
            self.freqs = precompute_freqs(m.rd, 0, m.rope_theta, m.rope_factor, m.beta_fast, m.beta_slow)
            self.compressor = self.indexer = None
        self.window = []  # every position's K=V row; the window picks the last `win`

    def forward(self, x, start_pos):
        m, rd, win, ratio = self.m, self.m.rd, self.win, self.ratio
        s = x.shape[0]
        pos = np.arange(start_pos, start_pos + s)
        qr = rms_norm(linear(x, self.wq_a), self.q_norm, m.eps)
        q = linear(qr, self.wq_b).reshape(s, self.n_heads, self.hd)
        q = q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True) + m.eps)
        q = apply_rotary(q, pos, self.freqs)
        kv = rms_norm(linear(x, self.wkv), self.kv_norm, m.eps)
        kv = apply_rotary(kv, pos, self.freqs)
        kv[:, :-rd] = act_quant(kv[:, :-rd], 64)
        comp_sel = None
        if ratio:
            comp_sel = self.indexer.forward(x, qr, start_pos) if self.indexer else None
        self.window.extend(list(kv))
        if ratio:
            self.compressor.forward(x, start_pos)
        wrows = np.array(self.window)
        nwin = len(self.window)
        crows = np.array(self.compressor.cache).reshape(-1, self.hd) if ratio else np.zeros((0, self.hd))
        allkv = np.concatenate([wrows, crows]) if len(crows) else wrows
        o = np.empty((s, self.n_heads, self.hd))
        for i in range(s):
            p = start_pos + i
            idx = list(range(max(0, p - win + 1), p + 1))  # get_window_topk_idxs
            if ratio:
                visible = (p + 1) // ratio
                if self.indexer:
                    idx += [nwin + t for t in comp_sel[i] if t >= 0]
                else:  # get_compress_topk_idxs
                    idx += [nwin + t for t in range(visible)]
            o[i] = sparse_attn(q[i], allkv, self.sink, idx, self.scale)
        o = apply_rotary(o, pos, self.freqs, inverse=True)
        og = o.reshape(s, self.groups, -1)
        wo_a = self.wo_a.reshape(self.groups, self.o_rank, -1)
        og = np.einsum("sgd,grd->sgr", og, wo_a)
        return linear(og.reshape(s, -1), self.wo_b)


# ---------------------------------------------------------------------------
# Gate, Expert, MoE, Block, Transformer (model.py)
# ---------------------------------------------------------------------------


class MoE:
    """model.py Gate + Expert + MoE.  Gate: sqrtsoftplus scores of a BF16
    router; hash layers take tid2eid[token], the others top-k of score + bias;
    weights = the unbiased scores of the chosen experts / their sum x
    route_scale.  Expert: w1/w3 (clamped SwiGLU), the routing weight applied
    before w2 (so before w2's act_quant); shared expert unweighted."""

    def __init__(self, m, layer, prefix=None):
        c, st = m.cfg, m.st
        p = (prefix or f"layers.{layer}") + ".ffn"
        self.m = m
        self.topk = c["num_experts_per_tok"]
        self.route_scale = c["routed_scaling_factor"]
        self.limit = c.get("swiglu_limit", 0.0)
        self.score_func = c["scoring_func"]
        self.hash = layer < c.get("num_hash_layers", 0)
        self.gate_temp = c.get("gate_temp", 1.0)  # V4.1 (the port's Gate)
        self.gate_w = st.get(p + ".gate.weight")
        self.bias = None if self.hash else st.get(p + ".gate.bias")
        self.tid2eid = st.get(p + ".gate.tid2eid") if self.hash else None
        self.experts = [[load_weight(st, f"{p}.experts.{e}.{w}", m) for w in ("w1", "w2", "w3")]
                        for e in range(c["n_routed_experts"])]
        self.shared = [load_weight(st, f"{p}.shared_experts.{w}", m) for w in ("w1", "w2", "w3")]

    def gate(self, x, ids):
        sc = x @ self.gate_w.T / self.gate_temp
        if self.score_func == "softmax":
            sc = softmax(sc, axis=-1)
        elif self.score_func == "sigmoid":
            sc = 1 / (1 + np.exp(-sc))
        else:  # sqrtsoftplus
            sc = np.sqrt(np.logaddexp(0.0, sc))
        orig = sc
        if self.bias is not None:
            sc = sc + self.bias
        if self.hash:
            ind = self.tid2eid[ids]
        else:
            ind = np.argsort(-sc, axis=-1, kind="stable")[:, :self.topk]
            for row in sc:
                topk_margin(row, self.topk)
        w = np.take_along_axis(orig, ind, axis=1)
        if self.score_func != "softmax":
            w = w / w.sum(axis=-1, keepdims=True)
        return w * self.route_scale, ind

    def expert(self, wts, x, weight=None):
        w1, w2, w3 = wts
        g = linear(x, w1)
        u = linear(x, w3)
        if self.limit > 0:
            u = np.clip(u, -self.limit, self.limit)
            g = np.minimum(g, self.limit)
        h = g / (1 + np.exp(-g)) * u
        if weight is not None:
            h = weight * h
        return linear(h, w2)

    def forward(self, x, ids):
        w, ind = self.gate(x, ids)
        y = np.zeros_like(x)
        for e in range(len(self.experts)):
            rows, slot = np.nonzero(ind == e)
            if len(rows):
                y[rows] += self.expert(self.experts[e], x[rows], w[rows, slot][:, None])
        return y + self.expert(self.shared, x)


def hc_split_sinkhorn(mixes, scale, base, hc, iters, eps):
    """kernel.py hc_split_sinkhorn: pre = sigmoid(.) + eps, post = 2 sigmoid(.),
    comb = softmax over the last axis + eps, then column / row Sinkhorn
    normalisation (first a column step, then iters - 1 row+column pairs)."""
    pre = 1 / (1 + np.exp(-(mixes[..., :hc] * scale[0] + base[:hc]))) + eps
    post = 2 / (1 + np.exp(-(mixes[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])))
    comb = (mixes[..., 2 * hc:] * scale[2] + base[2 * hc:]).reshape(mixes.shape[:-1] + (hc, hc))
    comb = softmax(comb, axis=-1) + eps
    comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(axis=-1, keepdims=True) + eps)
        comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    return pre, post, comb


class Block:
    """model.py Block: hc_pre -> attn_norm -> Attention -> hc_post, then
    hc_pre -> ffn_norm -> MoE -> hc_post, on hc_mult residual streams."""

    def __init__(self, m, layer, prefix=None):
        st = m.st
        p = prefix or f"layers.{layer}"
        self.m = m
        self.attn = Attention(m, layer, prefix)
        self.ffn = MoE(m, layer, prefix)
        self.attn_norm = st.get(f"{p}.attn_norm.weight")
        self.ffn_norm = st.get(f"{p}.ffn_norm.weight")
        self.hc = {k: (st.get(f"{p}.hc_{k}_fn"), st.get(f"{p}.hc_{k}_scale"),
                       st.get(f"{p}.hc_{k}_base")) for k in ("attn", "ffn")}

    def hc_pre(self, x, which):
        fn, scale, base = self.hc[which]
        m = self.m
        s, hc, d = x.shape
        xf = x.reshape(s, hc * d)
        rs = 1 / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + m.eps)
        mixes = (xf @ fn.T) * rs
        pre, post, comb = hc_split_sinkhorn(mixes, scale, base, hc, m.hc_iters, m.hc_eps)
        return (pre[:, :, None] * x).sum(axis=1), post, comb

    @staticmethod
    def hc_post(x, residual, post, comb):
        # y[k] = post[k] x + sum_j comb[j, k] residual[j]
        return post[:, :, None] * x[:, None, :] + np.einsum("sjk,sjd->skd", comb, residual)

    def forward(self, x, start_pos, ids):
        m = self.m
        res = x
        h, post, comb = self.hc_pre(x, "attn")
        h = self.attn.forward(rms_norm(h, self.attn_norm, m.eps), start_pos)
        x = self.hc_post(h, res, post, comb)
        res = x
        h, post, comb = self.hc_pre(x, "ffn")
        h = self.ffn.forward(rms_norm(h, self.ffn_norm, m.eps), ids)
        return self.hc_post(h, res, post, comb)


class Model:
    """model.py Transformer (+ ParallelHead): embed -> hc_mult copies ->
    blocks -> hc_head (sigmoid pre weights) -> norm -> head.  One instance
    is one sequence (the blocks hold its KV and compressor state)."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        self.cfg = c
        self.st = SafeTensors(os.path.join(model_dir, "model.safetensors"))
        qc = c.get("quantization_config", {})
        self.wblock = qc.get("weight_block_size", [128, 128])
        self.act_block = 128  # model.py block_size
        self.eps = c["rms_norm_eps"]
        self.rd = c["qk_rope_head_dim"]
        self.hc_mult, self.hc_iters, self.hc_eps = c["hc_mult"], c["hc_sinkhorn_iters"], c["hc_eps"]
        rs = c.get("rope_scaling") or {}
        # ModelArgs defaults where a key is absent
        self.rope_factor = rs.get("factor", 40)
        self.beta_fast = rs.get("beta_fast", 32)
        self.beta_slow = rs.get("beta_slow", 1)
        self.original_seq_len = rs.get("original_max_position_embeddings", 0)
        self.rope_theta = c["rope_theta"]
        self.compress_theta = c["compress_rope_theta"]
        self.embed = self.st.get("embed.weight")
        self.head = self.st.get("head.weight")
        self.norm = self.st.get("norm.weight")
        self.hc_head = (self.st.get("hc_head_fn"), self.st.get("hc_head_scale"), self.st.get("hc_head_base"))
        self.n_layers = c["num_hidden_layers"]
        self.reset()

    def reset(self):
        self.layers = [Block(self, i) for i in range(self.n_layers)]

    def head_hc(self, x, params=None):
        """ParallelHead.hc_head: pre = sigmoid(mixes * scale + base) + hc_eps
        (params: (fn, scale, base), the model's own by default; MTPBlock
        passes its hc_head_*)."""
        fn, scale, base = params or self.hc_head
        s, hc, d = x.shape
        xf = x.reshape(s, hc * d)
        rs = 1 / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        mixes = (xf @ fn.T) * rs
        pre = 1 / (1 + np.exp(-(mixes * scale + base))) + self.hc_eps
        return (pre[:, :, None] * x).sum(axis=1)

    def forward(self, ids, start_pos):
        """Transformer.forward for tokens `ids` at positions start_pos...
        Returns logits for every given position (the official head keeps the
        last only; the per-position head is the same function)."""
        ids = np.asarray(ids, dtype=np.int64)
        h = np.repeat(self.embed[ids][:, None, :], self.hc_mult, axis=1)
        for layer in self.layers:
            h = layer.forward(h, start_pos, ids)
        self.streams = h  # before hc_head: what MTPBlock.forward reads
        y = rms_norm(self.head_hc(h), self.norm, self.eps)
        return y @ self.head.T


class MTPBlock(Block):
    """model.py MTPBlock, layer_id n_layers + k, tensors mtp.k.*: a full
    Block (compress_ratios[layer_id] = 0: window-only attention with the
    main rope; learned routing, as layer_id >= num_hash_layers) whose input
    is e_proj(enorm(embed(token))), the same for every stream, plus
    h_proj(hnorm(x)) of each of the main model's hc_mult streams x (after
    its last block, before hc_head) at the same position; the logits are the
    shared head of norm(hc_head(streams)) with the block's own hc_head_*
    and norm.  At position p, x is the main model's streams at p and the
    token is the one at p + 1, so the logits predict the token at p + 2.
    e_proj and h_proj are FP8 linears (act_quant on their inputs).  One
    instance is one sequence (its Attention holds the window)."""

    def __init__(self, m, k=0):
        p = f"mtp.{k}"
        super().__init__(m, m.n_layers + k, p)
        st = m.st
        self.e_proj = load_weight(st, p + ".e_proj", m)
        self.h_proj = load_weight(st, p + ".h_proj", m)
        self.enorm = st.get(p + ".enorm.weight")
        self.hnorm = st.get(p + ".hnorm.weight")
        self.norm = st.get(p + ".norm.weight")
        self.hc_head = (st.get(p + ".hc_head_fn"), st.get(p + ".hc_head_scale"),
                        st.get(p + ".hc_head_base"))

    def forward(self, x, start_pos, ids):
        """x [s, hc, D] streams at positions start_pos.., ids [s] the tokens
        one position later.  Returns (logits [s, vocab], streams [s, hc, D]:
        what a further draft step reads as x)."""
        m = self.m
        ids = np.asarray(ids, dtype=np.int64)
        e = rms_norm(m.embed[ids], self.enorm, m.eps)
        x = linear(e, self.e_proj)[:, None, :] + linear(rms_norm(x, self.hnorm, m.eps), self.h_proj)
        x = super().forward(x, start_pos, ids)
        y = rms_norm(m.head_hc(x, self.hc_head), self.norm, m.eps)
        return y @ m.head.T, x


# ---------------------------------------------------------------------------
# DeepSeek-V4.1 (text).  The official V4.1 model.py could not be read; this
# follows ATOM's V4.1 eager reference (index id 66772560054: "Reference
# implementation: .../DeepSeek-V4.1-Flash/inference/model.py") for the
# round trips, Engram and the one-block mHC shift, and the published port of
# V4.1's model.py (id 68851935069) for CSA2 (sources, reuse, decode keys)
# and the Gate; V4's functions above where ATOM says V4.1 keeps V4's
# semantics (RoPE/YaRN, MoE, mHC primitives, sparse_attn).
# ---------------------------------------------------------------------------


def fp4_e4m3_scale_quant(x, block=16):
    """ATOM _fp4_roundtrip(x, 16, e4m3_scale=True), the compressed KV's trip:
    per block amax (at least 6 * 2^-9), s = e4m3(amax / 6),
    x <- sign(x) e2m1(min(|x| / s, 6)) s."""
    if not ROUND_TRIPS:
        return x
    xb = blocks(x, block)
    amax = np.maximum(np.abs(xb).max(axis=-1, keepdims=True), 6.0 * 2.0 ** -9)
    s = e4m3_round(amax / 6.0)
    y = np.sign(xb) * e2m1_round(np.minimum(np.abs(xb) / s, 6.0)) * s
    return y.reshape(x.shape)


class Compressor41:
    """V4.1 Compressor (ATOM Compressor / the port's): ratio 1 = rms(wkv(x));
    ratio 2 = per-channel softmax(wgate(x)) pooling of each complete group of
    `ratio` tokens (no ape, no overlap), then the norm.  Returns the
    un-rotated latent rows (the index keys project them before RoPE)."""

    def __init__(self, m, prefix, ratio):
        st = m.st
        self.m, self.ratio = m, ratio
        self.wkv = load_weight(st, prefix + ".wkv", m)
        self.wgate = load_weight(st, prefix + ".wgate", m) if ratio > 1 else None
        self.norm = st.get(prefix + ".norm.weight")
        d = self.wkv[0].shape[0]
        self.kv_state = np.zeros((ratio, d))
        self.score_state = np.full((ratio, d), -np.inf)

    def forward(self, x, start_pos):
        ratio, m = self.ratio, self.m
        kv = linear(x, self.wkv)  # BF16 weights: no act_quant
        if ratio == 1:
            return rms_norm(kv, self.norm, m.eps)
        score = linear(x, self.wgate)
        if start_pos == 0:
            n = x.shape[0]
            rem = n % ratio
            cutoff = n - rem
            if rem:
                self.kv_state[:rem] = kv[cutoff:]
                self.score_state[:rem] = score[cutoff:]
            if cutoff == 0:
                return None
            kv = kv[:cutoff].reshape(-1, ratio, kv.shape[-1])
            score = score[:cutoff].reshape(-1, ratio, score.shape[-1])
            kv = (kv * softmax(score, axis=1)).sum(axis=1)
        else:
            self.kv_state[start_pos % ratio] = kv[0]
            self.score_state[start_pos % ratio] = score[0]
            if (start_pos + 1) % ratio:
                return None
            kv = (self.kv_state * softmax(self.score_state, axis=0)).sum(axis=0, keepdims=True)
        return rms_norm(kv, self.norm, m.eps)


def select_candidate_blocks(score, visible, topk_blocks, block_size):
    """ATOM select_candidate_blocks for one query: block score = max of its
    entries (unreachable ones -inf), the block holding the newest visible
    entry pinned, the best topk_blocks blocks kept (a -inf block is not).
    Returns a bool mask over the entries."""
    n = len(score)
    nb = -(-n // block_size)
    padded = np.full(nb * block_size, -np.inf)
    padded[:n] = score
    bs = padded.reshape(nb, block_size).max(axis=1)
    last = (visible - 1) // block_size
    if 0 <= last < nb:
        bs[last] = np.inf
    top = np.argsort(-bs, kind="stable")[:min(topk_blocks, nb)]
    keep = np.zeros(nb, dtype=bool)
    keep[top] = bs[top] > -np.inf
    return np.repeat(keep, block_size)[:n]


class Indexer41:
    """V4.1 Indexer (ATOM Indexer; the port's): index keys k_norm(wk(latent))
    with RoPE at the group's first position, published by KV-source layers;
    q = wq_b(qr) with RoPE; both through FP4/32 (power-of-two scales, no
    Hadamard); score = sum_h relu(q_h . k) w_h; the candidate source keeps
    candidate blocks that the later index layers are restricted to."""

    def __init__(self, m, layer, prefix, ratio, freqs):
        c, st = m.cfg, m.st
        self.m, self.ratio, self.freqs = m, ratio, freqs
        self.n_heads, self.hd, self.topk = c["index_n_heads"], c["index_head_dim"], c["index_topk"]
        self.owns_k = layer in c["kv_source_layer_ids"]
        cand = c.get("candidate_source_layer_id", -1)
        self.is_cand_src = layer == cand
        self.uses_cands = 0 <= cand < layer
        self.cand_blocks, self.cand_size = c.get("candidate_topk_blocks", 0), c.get("candidate_block_size", 0)
        self.wq_b = load_weight(st, prefix + ".wq_b", m)
        self.weights_proj = load_weight(st, prefix + ".weights_proj", m)
        if self.owns_k:
            self.wk = load_weight(st, prefix + ".wk", m)
            self.k_norm = st.get(prefix + ".k_norm.weight")
        self.keys = []

    def publish_keys(self, latent, first):
        k = rms_norm(linear(latent, self.wk), self.k_norm, self.m.eps)
        k = apply_rotary(k, (first + np.arange(len(k))) * self.ratio, self.freqs)
        self.keys.extend(list(fp4_act_quant(k, 32)))

    def forward(self, x, qr, start_pos, keys, shared):
        s = x.shape[0]
        ratio = self.ratio
        pos = np.arange(start_pos, start_pos + s)
        q = linear(qr, self.wq_b).reshape(s, self.n_heads, self.hd)
        q = fp4_act_quant(apply_rotary(q, pos, self.freqs), 32)
        w = linear(x, self.weights_proj) * (self.hd ** -0.5 * self.n_heads ** -0.5)
        n = (start_pos + s) // ratio
        k = np.array(keys[:n]).reshape(n, self.hd)
        sc = (np.maximum(np.einsum("shd,td->sht", q, k), 0) * w[:, :, None]).sum(axis=1)
        out, cands = [], []
        for i in range(s):
            visible = (start_pos + i + 1) // ratio
            row = sc[i].copy()
            row[visible:] = -np.inf
            if self.is_cand_src:
                cands.append(select_candidate_blocks(row, visible, self.cand_blocks, self.cand_size))
                nb = -(-len(row) // self.cand_size)
                bmax = np.full(nb * self.cand_size, -np.inf)
                bmax[:len(row)] = row
                bmax = bmax.reshape(nb, -1).max(axis=1)
                if 0 < visible:
                    bmax[(visible - 1) // self.cand_size] = np.inf
                topk_margin(bmax[np.isfinite(bmax)], self.cand_blocks - 1)
            elif self.uses_cands:
                row[~shared["candidates"][i][:n]] = -np.inf
            top = np.argsort(-row, kind="stable")[:min(self.topk, n)]
            topk_margin(row, min(self.topk, n))
            out.append(sorted(int(t) for t in top if t < visible and row[t] > -np.inf))
        if self.is_cand_src:
            shared["candidates"] = cands
        return out


class Attention41:
    """V4.1 attention (ATOM DeepseekV41Attention.forward_eager; the port's
    Attention): q = wq_b(q_norm(wq_a(x))) with RoPE (no per-head RMS in
    V4.1), a K=V window row FP8/32 over the whole row; compress layers read
    the nearest KV source's rows (RoPE at the group's first position, then
    FP4/16 with E4M3 scales) selected by the nearest index source's top-k;
    sink softmax; inverse RoPE; wo_a (BF16 einsum) and wo_b."""

    def __init__(self, m, layer):
        c, st, p = attn_weights(self, m, layer)
        if self.ratio:
            self.freqs = precompute_freqs(m.rd, m.original_seq_len, m.compress_theta,
                                          m.rope_factor, m.beta_fast, m.beta_slow)
        else:
            self.freqs = precompute_freqs(m.rd, 0, m.rope_theta, m.rope_factor, m.beta_fast, m.beta_slow)
        self.is_kv_src = layer in c["kv_source_layer_ids"]
        self.is_idx_src = layer in c["index_source_layer_ids"]
        self.compressor = Compressor41(m, p + ".compressor", self.ratio) if self.is_kv_src else None
        self.indexer = Indexer41(m, layer, p + ".indexer", self.ratio, self.freqs) if self.is_idx_src else None
        self.crows = []  # this KV source's compressed rows (rotated, FP4)
        self.window = []

    def forward(self, x, start_pos, shared):
        m, win, ratio = self.m, self.win, self.ratio
        s = x.shape[0]
        pos = np.arange(start_pos, start_pos + s)
        qr = rms_norm(linear(x, self.wq_a), self.q_norm, m.eps)
        q = apply_rotary(linear(qr, self.wq_b).reshape(s, self.n_heads, self.hd), pos, self.freqs)
        kv = apply_rotary(rms_norm(linear(x, self.wkv), self.kv_norm, m.eps), pos, self.freqs)
        kv = act_quant(kv, 32)
        self.window.extend(list(kv))
        if ratio:
            if self.is_kv_src:
                latent = self.compressor.forward(x, start_pos)
                if latent is not None:
                    first = start_pos // ratio
                    if self.indexer is not None and self.indexer.owns_k:
                        self.indexer.publish_keys(latent, first)
                    rows = apply_rotary(latent, (first + np.arange(len(latent))) * ratio, self.freqs)
                    self.crows.extend(list(fp4_e4m3_scale_quant(rows, 16)))
                shared["compress_kv"] = self.crows
                if self.indexer is not None and self.indexer.owns_k:
                    shared["index_k"] = self.indexer.keys  # own keys at every step (the port's decode)
            if self.is_idx_src:
                shared["topk"] = self.indexer.forward(x, qr, start_pos, shared["index_k"], shared)
        nwin = len(self.window)
        allkv = np.array(self.window)
        if ratio and len(shared["compress_kv"]):
            allkv = np.concatenate([allkv, np.array(shared["compress_kv"])])
        o = np.empty((s, self.n_heads, self.hd))
        for i in range(s):
            p = start_pos + i
            idx = list(range(max(0, p - win + 1), p + 1))
            if ratio:
                idx += [nwin + t for t in shared["topk"][i]]
            o[i] = sparse_attn(q[i], allkv, self.sink, idx, self.scale)
        o = apply_rotary(o, pos, self.freqs, inverse=True)
        og = np.einsum("sgd,grd->sgr", o.reshape(s, self.groups, -1),
                       self.wo_a.reshape(self.groups, self.o_rank, -1))
        return linear(og.reshape(s, -1), self.wo_b)


class Engram41:
    """ATOM Engram: the n-gram rows (E4M3, one E8M0 scale per 32 columns of
    each row) -> wkv (FP8 linear) -> one key per stream + one value; each
    stream gets value x sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot)), dot
    the RMS-normalised, q_weight*k_weight-weighted stream.key / sqrt(dim)."""

    def __init__(self, m, layer):
        st = m.st
        p = f"layers.{layer}.engram"
        self.m = m
        w = st.get(p + ".embed.weight")
        sc = np.repeat(st.get(p + ".embed.scale"), 32, axis=1)
        self.table = w * sc
        self.wkv = load_weight(st, p + ".wkv", m)
        self.qk = st.get(p + ".q_weight") * st.get(p + ".k_weight")  # [hc, dim]

    def forward(self, h, hash_ids):
        s, hc, dim = h.shape
        kv = linear(self.table[hash_ids].reshape(s, -1), self.wkv)
        key, value = kv[:, :hc * dim].reshape(s, hc, dim), kv[:, hc * dim:]
        eps = self.m.eps
        rstd = 1 / np.sqrt(np.mean(h * h, axis=-1) + eps) / np.sqrt(np.mean(key * key, axis=-1) + eps)
        dot = (h * self.qk * key).sum(axis=-1) * rstd * dim ** -0.5
        g = np.copysign(np.sqrt(np.maximum(np.abs(dot), 1e-6)), dot)
        gate = 1 / (1 + np.exp(-g))
        return h + gate[:, :, None] * value[:, None, :]


class EngramHash:
    """The n-gram hash (HF DeepseekV41NgramHashState as the fixture README
    states it, inputs from engram_hash.json): slot s holds the compressed id
    of the token at p - s (the compressed pad id before 0); rho = prod[0],
    then for n = 1..3 rho ^= prod[n] and column (n-1)*heads + h is
    rho mod prime[l][n-1][h] + offset[l][(n-1)*heads + h]."""

    def __init__(self, path):
        with open(path) as f:
            h = json.load(f)
        self.map, self.pad = h["token_map"], h["compressed_pad_id"]
        self.mult, self.primes, self.offsets = h["multipliers"], h["primes"], h["offsets"]
        self.layer_ids, self.heads, self.n = h["layer_ids"], h["n_heads"], h["max_ngram_size"]

    def ids(self, tokens, p, li):
        tok = [self.map[tokens[p - s]] if p - s >= 0 else self.pad for s in range(self.n)]
        prod = [t * mu for t, mu in zip(tok, self.mult[li])]
        rho, out = prod[0], []
        for n in range(1, self.n):
            rho ^= prod[n]
            for hh in range(self.heads):
                out.append(rho % self.primes[li][n - 1][hh] + self.offsets[li][(n - 1) * self.heads + hh])
        return out


class Block41:
    """ATOM DeepseekV41Block: Engram (where present) on the streams, then
    mHC with the one-block shift: a sub-layer's input is collapsed with the
    PREVIOUS sub-layer's `pre`; post/comb are its own."""

    def __init__(self, m, layer):
        st = m.st
        self.m, self.layer = m, layer
        self.attn = Attention41(m, layer)
        self.ffn = MoE(m, layer)
        self.attn_norm = st.get(f"layers.{layer}.attn_norm.weight")
        self.ffn_norm = st.get(f"layers.{layer}.ffn_norm.weight")
        self.hc = {k: (st.get(f"layers.{layer}.hc_{k}_fn"), st.get(f"layers.{layer}.hc_{k}_scale"),
                       st.get(f"layers.{layer}.hc_{k}_base")) for k in ("attn", "ffn")}
        self.engram = Engram41(m, layer) if layer in m.cfg.get("engram_layer_ids", []) else None

    def hc_mixes(self, x, which):
        fn, scale, base = self.hc[which]
        s, hc, d = x.shape
        xf = x.reshape(s, hc * d)
        mixes = (xf @ fn.T) / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + self.m.eps)
        return hc_split_sinkhorn(mixes, scale, base, hc, self.m.hc_iters, self.m.hc_eps)

    def forward(self, res, pre_mix, start_pos, ids, hashes, shared):
        m = self.m
        if self.engram is not None:
            res = self.engram.forward(res, hashes[self.layer])
        a_pre, a_post, a_comb = self.hc_mixes(res, "attn")
        x = rms_norm((pre_mix[:, :, None] * res).sum(axis=1), self.attn_norm, m.eps)
        res = Block.hc_post(self.attn.forward(x, start_pos, shared), res, a_post, a_comb)
        f_pre, f_post, f_comb = self.hc_mixes(res, "ffn")
        x = rms_norm((a_pre[:, :, None] * res).sum(axis=1), self.ffn_norm, m.eps)
        res = Block.hc_post(self.ffn.forward(x, ids), res, f_post, f_comb)
        return res, f_pre


class Model41:
    """ATOM DeepseekV41Model + head: embed -> hc copies (pre one-hot on
    stream 0) -> blocks -> collapse with the last `pre` -> norm -> head.
    One instance is one sequence."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            top = json.load(f)
        c = dict(top["text_config"])
        self.cfg = c
        self.st = SafeTensors(os.path.join(model_dir, "model.safetensors"))
        qc = top.get("quantization_config", {})
        self.wblock = qc.get("weight_block_size", [128, 128])
        # activation trip on FP8/FP4 linears: blocks of the weight block's
        # input width (strata's reading; ATOM quantizes per 1x128 and its
        # source says the [32, 32] spec is not handled yet; power-of-two scales make the
        # two differ only through subnormal codes)
        self.act_block = self.wblock[1]
        self.eps = c["rms_norm_eps"]
        self.rd = c["qk_rope_head_dim"]
        self.hc_mult, self.hc_iters, self.hc_eps = c["hc_mult"], c["hc_sinkhorn_iters"], c["hc_eps"]
        rs = c.get("rope_scaling") or {}
        self.rope_factor = rs.get("factor", 40)
        self.beta_fast = rs.get("beta_fast", 32)
        self.beta_slow = rs.get("beta_slow", 1)
        self.original_seq_len = rs.get("original_max_position_embeddings", 0)
        self.rope_theta, self.compress_theta = c["rope_theta"], c["compress_rope_theta"]
        self.embed = self.st.get("embed.weight")
        self.head = self.st.get("head.weight")
        self.norm = self.st.get("norm.weight")
        self.n_layers = c["num_hidden_layers"]
        self.hash = EngramHash(os.path.join(model_dir, "engram_hash.json"))
        self.reset()

    def reset(self):
        self.layers = [Block41(self, i) for i in range(self.n_layers)]
        self.tokens = []
        self.shared = {}

    def forward(self, ids, start_pos):
        assert start_pos == len(self.tokens)
        self.tokens.extend(int(t) for t in ids)
        s = len(ids)
        hashes = {l: np.array([self.hash.ids(self.tokens, start_pos + i, li) for i in range(s)])
                  for li, l in enumerate(self.hash.layer_ids)}
        ids = np.asarray(ids, dtype=np.int64)
        res = np.repeat(self.embed[ids][:, None, :], self.hc_mult, axis=1)
        pre = np.zeros((s, self.hc_mult))
        pre[:, 0] = 1.0
        for layer in self.layers:
            res, pre = layer.forward(res, pre, start_pos, ids, hashes, self.shared)
        y = rms_norm((pre[:, :, None] * res).sum(axis=1), self.norm, self.eps)
        return y @ self.head.T


# ---------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------


def summarize(logits):
    """argmax, top-2 gap, top-10 [id, logit] and log-sum-exp of one row."""
    top = np.argsort(-logits, kind="stable")[:10]
    mx = logits.max()
    lse = mx + math.log(np.exp(logits - mx).sum())
    return {
        "argmax": int(top[0]),
        "top1_minus_top2": round(float(logits[top[0]] - logits[top[1]]), 6),
        "top10": [[int(t), round(float(logits[t]), 6)] for t in top],
        "lse": round(float(lse), 6),
    }


def run_case(model, ids, steps, decode_all=False):
    """Prefill of the prompt (every position's logits), then `steps` greedy
    tokens decoded one at a time.  Then the prompt again token by token (with
    decode_all, its logits are the ones returned): its logits must equal the
    prefill's (they are the same function), and it records every prompt
    position's knife-edge margin (MARGINS), as the decode steps do.
    Returns (prompt summaries, greedy ids, step summaries, margins)."""
    global CUR_POS
    MARGINS.clear()
    model.reset()
    logits = model.forward(ids, 0)  # prefill
    cont, cont_steps = [], []
    last = logits[-1]
    pos = len(ids)
    for i in range(steps):
        st = summarize(last)
        st["pos"] = pos - 1
        cont_steps.append(st)
        cont.append(st["argmax"])
        if i + 1 < steps:
            CUR_POS = pos
            last = model.forward([st["argmax"]], pos)[0]  # one-token decode
            CUR_POS = None
            pos += 1
    model.reset()
    one = np.empty_like(logits)
    for p, t in enumerate(ids):
        CUR_POS = p
        one[p] = model.forward([t], p)[0]
        CUR_POS = None
    diff = float(np.abs(one - logits).max())
    if diff > 1e-9:
        raise RuntimeError(f"prefill and token-by-token logits differ by {diff:.3g}")
    if decode_all:
        logits = one
    prompt = [summarize(row) for row in logits]
    return prompt, cont, cont_steps, dict(MARGINS)


def run_mtp_case(model, ids, chain):
    """The MTP block on a prompt ids[0..n): the main model token by token
    (its streams at every position), the block teacher-forced at positions
    0..n-2 (streams at i, token ids[i + 1]), then a draft chain of `chain`
    steps after the prompt: at n - 1 the main model's streams and its greedy
    token g0, then at each later position the block's own output streams
    and its previous argmax (one MTP layer reused, as the serving engines
    chain it).  The block evaluated on the whole prompt at once must give
    the teacher-forced logits (1e-9).  Returns (summaries of positions
    0..n-2, chain tokens [g0, d1, ..., d_chain], chain summaries, margins:
    per position, of the main model's evaluation there and the block's)."""
    global CUR_POS
    MARGINS.clear()
    model.reset()
    n = len(ids)
    streams, last = [], None
    mtp = MTPBlock(model)
    rows = []
    for p, t in enumerate(ids):
        CUR_POS = p
        last = model.forward([t], p)[0]
        streams.append(model.streams[0])
        if p >= 1:
            CUR_POS = p - 1
            rows.append(mtp.forward(streams[p - 1][None], p - 1, [t])[0][0])
        CUR_POS = None
    toks = [int(np.argmax(last))]
    steps = []
    x = streams[-1][None]
    for i in range(chain):
        CUR_POS = n - 1 + i
        lg, x = mtp.forward(x, n - 1 + i, [toks[-1]])
        CUR_POS = None
        st = summarize(lg[0])
        st["pos"] = n - 1 + i
        steps.append(st)
        toks.append(st["argmax"])
    if n >= 2:
        whole = MTPBlock(model).forward(np.array(streams[:-1]), 0, ids[1:])[0]
        diff = float(np.abs(whole - np.array(rows)).max())
        if diff > 1e-9:
            raise RuntimeError(f"MTP prefill and token-by-token logits differ by {diff:.3g}")
    return [summarize(r) for r in rows], toks, steps, dict(MARGINS)


def write_cases(path, out, ref, want, one):
    """For each case of ref (those named in want, or all): one(prompt ids)
    gives (its fields, margins, a note for the log); the case goes to
    out["cases"] with its name, ids and fragile positions (margins below
    FRAGILE_RECORD); out is written to path as one line of JSON."""
    for case in ref["cases"]:
        if want and case["name"] not in want:
            continue
        ids = case["ids"][:case["n_prompt"]]
        fields, margins, note = one(ids)
        fragile = [[p, float("%.2g" % mg)] for p, mg in sorted(margins.items()) if mg < FRAGILE_RECORD]
        out["cases"].append({"name": case["name"], "ids": ids, **fields,
                             "fragile_positions": fragile})
        print(f"{case['name']}: {len(ids)} prompt tokens, {note}", file=sys.stderr)
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--steps", type=int, default=16, help="greedy continuation length")
    ap.add_argument("--exact", action="store_true",
                    help="round trips off (checks the oracle against the fixture's strict reference)")
    ap.add_argument("--decode-all", action="store_true",
                    help="feed the prompt one token at a time too (checks prefill = decode)")
    ap.add_argument("--mtp", type=int, default=0, metavar="K",
                    help="the MTP block (mtp.0) instead: teacher-forced on each prompt, then a "
                         "K-step draft chain (V4 only)")
    ap.add_argument("--no-act-trip", action="store_true",
                    help="no FP8 trip on linear inputs (checks the oracle against the V4.1 fixture's reference.json)")
    a = ap.parse_args()
    global ROUND_TRIPS, ACT_TRIP
    ROUND_TRIPS = not a.exact
    ACT_TRIP = not a.no_act_trip
    with open(os.path.join(a.model_dir, "reference.json")) as f:
        ref = json.load(f)
    want = [x for x in a.cases.split(",") if x]
    with open(os.path.join(a.model_dir, "config.json")) as f:
        v41 = "text_config" in json.load(f)
    model = Model41(a.model_dir) if v41 else Model(a.model_dir)
    if a.mtp:
        if v41:
            sys.exit("--mtp: V4 only (the V4.1 fixture has no draft layers)")
        return main_mtp(a, model, ref, want)
    out = {
        "generator": "scripts/dsv-oracle.py " + " ".join(sys.argv[1:]),
        "model": os.path.basename(os.path.normpath(a.model_dir)),
        "follows": ("ATOM's V4.1 eager reference (index id 66772560054) and the port of V4.1's "
                    "inference/model.py (id 68851935069), V4's kernel.py semantics (ids 60864417075, "
                    "60445807715) where they keep V4's: round trips on, float64 otherwise" if v41 else
                    "official DeepSeek-V4-Flash inference/model.py at upstream 60d8d70 "
                    "(index id 70831076062) and its kernel.py (ids 60864417075, 60445807715): "
                    "round trips on, float64 otherwise"),
        "math": ("official (FP8 ue8m0 per 32 on FP8/FP4 linear inputs and on the whole window KV "
                 "row; compressed KV E2M1 per 16 with E4M3 scales; FP4/32 on indexer q and keys; "
                 "routing weight before w2; wo_a without the trip)" if v41 else
                 "official (act_quant FP8 ue8m0 blocks of 128 on FP8/FP4 linear inputs, "
                 "blocks of 64 on window/compressed KV non-rope dims; Hadamard + FP4/32 on "
                 "indexer q and keys; routing weight before w2; wo_a without act_quant)"),
        **({"check": "--exact: every round trip off (a check of the oracle, not the official math)"}
           if a.exact else {"check": "--no-act-trip: no FP8 trip on linear inputs (a check of "
                                     "the oracle, not the official math)"} if a.no_act_trip else {}),
        "fragile_positions": "per case, [position, margin]: the positions where a rounding "
                             "(E4M3/E2M1 midpoint, power-of-two scale boundary) or a top-k choice "
                             "(indexer, candidate blocks, router) lies within a relative margin "
                             f"below {FRAGILE_RECORD:g} of its boundary, so that float32 may decide "
                             "it the other way",
        "cases": [],
    }
    def one(ids):
        prompt, cont, steps, margins = run_case(model, ids, a.steps, a.decode_all)
        return ({"prompt_positions": prompt, "greedy_continuation": cont,
                 "continuation_steps": steps}, margins, f"continuation {cont}")

    write_cases(a.out, out, ref, want, one)


def main_mtp(a, model, ref, want):
    """--mtp K: the MTP block's logits (run_mtp_case) per case."""
    out = {
        "generator": "scripts/dsv-oracle.py " + " ".join(sys.argv[1:]),
        "model": os.path.basename(os.path.normpath(a.model_dir)),
        "follows": "official DeepSeek-V4-Flash inference/model.py MTPBlock (layer_id n_layers, "
                   "tensors mtp.0.*; upstream 60d8d70, index file id 70831076062) on the main "
                   "model of the same file: round trips on, float64 otherwise",
        "mtp": "per case: mtp_positions[i], i = 0..n-2: the block at position i on the main "
               "model's streams at i and token ids[i+1] (predicts ids[i+2]); chain_tokens "
               "[g0, d1, ..]: g0 the main model's greedy token after the prompt, d_j the argmax "
               "of chain_steps[j-1]; chain_steps[j]: the block at position n-1+j on the main "
               "model's streams at n-1 (j = 0) or its own output streams of step j-1, and "
               "token chain_tokens[j]",
        **({"check": "--exact: every round trip off (a check of the oracle, not the official math)"}
           if a.exact else {}),
        "fragile_positions": "per case, [position, margin]: positions where a rounding or top-k "
                             "choice of the main model or of the block lies within a relative "
                             f"margin below {FRAGILE_RECORD:g} of its boundary",
        "cases": [],
    }
    def one(ids):
        rows, toks, steps, margins = run_mtp_case(model, ids, a.mtp)
        return ({"mtp_positions": rows, "chain_tokens": toks, "chain_steps": steps},
                margins, f"draft chain {toks}")

    write_cases(a.out, out, ref, want, one)


if __name__ == "__main__":
    main()
