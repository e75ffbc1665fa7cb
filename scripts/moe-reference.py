#!/usr/bin/python3
"""Reference logits of a small MoE checkpoint, computed in float64 numpy.

An implementation of the forward pass independent of strata's C code, for
the generated test models (scripts/gen-moe-model.py): it reads config.json
and the safetensors file(s) of a checkpoint directory with its own reader
and writes reference.json in the layout of the fixtures' references
(../shared/fixtures/models/*/reference.json), which tests/computed/
test_reference.c checks computed against:

  prompts[]: ids, positions[] {top10 [[id, logit] x 10], lse, experts
             [layer][k] (top-k expert ids by descending router weight)},
             greedy_f32 (greedy continuation, each step recomputing the
             whole sequence)
  tolerances.f32: logit_abs, lse_abs

Families (MODEL_FAMILIES.md): Qwen3-MoE (section 4: q_norm/k_norm, no
biases) and Qwen2-MoE (section 3: q/k/v biases, routed mixture plus one
shared expert scaled by sigmoid(shared_expert_gate . x)).  Decoder
skeleton 0.2, RMSNorm x * w / sqrt(mean(x^2) + eps), half-split RoPE 0.5,
causal GQA attention with scale 1/sqrt(head_dim), router softmax then
top-k (renormalised when norm_topk_prob), SwiGLU experts
down(silu(gate x) * up x).  Every weight is the checkpoint's BF16 value
widened exactly; all arithmetic is float64.

--shared-experts fp8 computes instead with the shared experts' matrices
as strata convert --shared-experts fp8 stores them (st_fp8_quantize_row):
per row and block of 128 columns, scale s = amax / 448 (float32), codes
E4M3(x / s) rounded to nearest even and saturated at 448, value code * s.

Only numpy is needed (run with /usr/bin/python3).  For small models: the
whole checkpoint is loaded in memory.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np


def e4m3_table():
    """The non-negative finite E4M3 values, in code order (ascending)."""
    v = []
    for code in range(0x7F):  # 0x7F is NaN
        e, m = code >> 3, code & 7
        v.append(m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(v)


def fp8_roundtrip(w, block=128):
    """w [rows, cols] through FP8 E4M3 with a float32 scale per row and
    block of `block` columns, back to float64."""
    tab = e4m3_table()
    out = np.empty_like(w)
    for b0 in range(0, w.shape[1], block):
        x = w[:, b0:b0 + block].astype(np.float32)
        s = (np.abs(x).max(axis=1, keepdims=True) / np.float32(448.0)
             ).astype(np.float32)
        safe = np.where(s == 0, np.float32(1), s)
        y = np.abs(x / safe).astype(np.float64)
        i = np.clip(np.searchsorted(tab, y), 1, len(tab) - 1)
        lo, hi = tab[i - 1], tab[i]
        up = (y - lo > hi - y) | ((y - lo == hi - y) & ((i - 1) % 2 == 1))
        q = np.where(y >= tab[-1], tab[-1], np.where(up, hi, lo))
        q = np.where(s == 0, 0.0, q)
        out[:, b0:b0 + block] = np.sign(x) * q * s.astype(np.float64)
    return out


def load_checkpoint(d):
    """{name: float64 array} from model.safetensors or the shards named by
    model.safetensors.index.json (BF16, F16, F32)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        with open(os.path.join(d, fn), "rb") as f:
            blob = f.read()
        (hlen,) = struct.unpack("<Q", blob[:8])
        hdr = json.loads(blob[8:8 + hlen])
        base = 8 + hlen
        for name, t in hdr.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            raw = blob[base + a:base + b]
            if t["dtype"] == "BF16":
                u = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
                x = u.view(np.float32)
            elif t["dtype"] == "F16":
                x = np.frombuffer(raw, np.float16)
            elif t["dtype"] == "F32":
                x = np.frombuffer(raw, np.float32)
            else:
                raise SystemExit("moe-reference: %s: dtype %s not supported"
                                 % (name, t["dtype"]))
            out[name] = x.astype(np.float64).reshape(t["shape"])
    return out


class Model:
    def __init__(self, d, shared_fp8=False):
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        self.c = c
        self.family = c["model_type"]
        if self.family not in ("qwen2_moe", "qwen3_moe"):
            raise SystemExit("moe-reference: model_type %s: only qwen2_moe "
                             "and qwen3_moe" % self.family)
        self.w = load_checkpoint(d)
        self.H = c["hidden_size"]
        self.L = c["num_hidden_layers"]
        self.nh = c["num_attention_heads"]
        self.nkv = c["num_key_value_heads"]
        self.hd = c.get("head_dim") or self.H // self.nh
        self.E = c["num_experts"]
        self.K = c["num_experts_per_tok"]
        self.norm_topk = bool(c.get("norm_topk_prob", False))
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.theta = c.get("rope_theta", 10000.0)
        self.qkv_bias = (self.family == "qwen2_moe"
                         and c.get("qkv_bias", True))
        self.shared = self.family == "qwen2_moe"
        self.tied = c.get("tie_word_embeddings", False)
        if shared_fp8:
            for n in list(self.w):
                if ".mlp.shared_expert." in n and n.endswith(".weight"):
                    self.w[n] = fp8_roundtrip(self.w[n])

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True)
                           + self.eps) * w

    def rope(self, x, pos):
        """x [T, heads, hd]; half-split pairs (i, i + hd/2)."""
        half = self.hd // 2
        inv = self.theta ** (-np.arange(half, dtype=np.float64) * 2 / self.hd)
        ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    @staticmethod
    def swiglu(x, g, u, dn):
        a = x @ g.T
        return ((a / (1 + np.exp(-a))) * (x @ u.T)) @ dn.T

    def forward(self, ids):
        """Logits [T, V] and routed experts [T][L][K] of one sequence."""
        w, T = self.w, len(ids)
        x = w["model.embed_tokens.weight"][ids]
        pos = np.arange(T)
        routed = [[None] * self.L for _ in range(T)]
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for n in range(self.L):
            p = "model.layers.%d." % n
            xn = self.rms(x, w[p + "input_layernorm.weight"])
            q = xn @ w[p + "self_attn.q_proj.weight"].T
            k = xn @ w[p + "self_attn.k_proj.weight"].T
            v = xn @ w[p + "self_attn.v_proj.weight"].T
            if self.qkv_bias:
                q = q + w[p + "self_attn.q_proj.bias"]
                k = k + w[p + "self_attn.k_proj.bias"]
                v = v + w[p + "self_attn.v_proj.bias"]
            q = q.reshape(T, self.nh, self.hd)
            k = k.reshape(T, self.nkv, self.hd)
            v = v.reshape(T, self.nkv, self.hd)
            if self.family == "qwen3_moe":
                q = self.rms(q, w[p + "self_attn.q_norm.weight"])
                k = self.rms(k, w[p + "self_attn.k_norm.weight"])
            q, k = self.rope(q, pos), self.rope(k, pos)
            rep = self.nh // self.nkv
            att = np.empty((T, self.nh, self.hd))
            for h in range(self.nh):
                s = q[:, h] @ k[:, h // rep].T / np.sqrt(self.hd) + mask
                s = np.exp(s - s.max(-1, keepdims=True))
                s /= s.sum(-1, keepdims=True)
                att[:, h] = s @ v[:, h // rep]
            x = x + att.reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T
            xn = self.rms(x, w[p + "post_attention_layernorm.weight"])
            logits = xn @ w[p + "mlp.gate.weight"].T
            pr = np.exp(logits - logits.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            out = np.zeros_like(x)
            for t in range(T):
                top = np.argsort(-pr[t], kind="stable")[:self.K]
                wt = pr[t][top]
                if self.norm_topk:
                    wt = wt / wt.sum()
                routed[t][n] = [int(e) for e in top]
                for e, we in zip(top, wt):
                    q_ = p + "mlp.experts.%d." % e
                    out[t] += we * self.swiglu(
                        xn[t], w[q_ + "gate_proj.weight"],
                        w[q_ + "up_proj.weight"], w[q_ + "down_proj.weight"])
            if self.shared:
                s = p + "mlp.shared_expert."
                sh = self.swiglu(xn, w[s + "gate_proj.weight"],
                                 w[s + "up_proj.weight"],
                                 w[s + "down_proj.weight"])
                g = xn @ w[p + "mlp.shared_expert_gate.weight"].T  # [T, 1]
                out = out + sh / (1 + np.exp(-g))
            x = x + out
        x = self.rms(x, w["model.norm.weight"])
        head = w["model.embed_tokens.weight" if self.tied else
                 "lm_head.weight"]
        return x @ head.T, routed


def lse(v):
    m = v.max()
    return float(m + np.log(np.exp(v - m).sum()))


def main(argv):
    ap = argparse.ArgumentParser(
        prog="moe-reference.py",
        description="Write reference.json (float64 numpy forward pass) for "
                    "a small Qwen2-MoE / Qwen3-MoE checkpoint, in the "
                    "layout of the fixtures' references.")
    ap.add_argument("model", help="checkpoint directory")
    ap.add_argument("--out", help="output file (default MODEL/reference.json)")
    ap.add_argument("--prompts", type=int, default=3,
                    help="number of prompts (default 3)")
    ap.add_argument("--greedy", type=int, default=8,
                    help="greedy tokens per prompt (default 8)")
    ap.add_argument("--seed", type=int, default=5, help="prompt id seed")
    ap.add_argument("--shared-experts", choices=("bf16", "fp8"),
                    default="bf16",
                    help="shared experts as in the checkpoint (bf16, the "
                         "default) or as convert --shared-experts fp8 "
                         "stores them")
    a = ap.parse_args(argv)
    m = Model(a.model, shared_fp8=a.shared_experts == "fp8")
    V = m.w["model.embed_tokens.weight"].shape[0]
    rng = np.random.default_rng(a.seed)
    prompts = []
    for pi in range(a.prompts):
        ids = [int(i) for i in rng.integers(0, V, 4 + 3 * pi)]
        lg, routed = m.forward(ids)
        positions = []
        for t in range(len(ids)):
            top = np.argsort(-lg[t], kind="stable")[:10]
            positions.append({"top10": [[int(i), float(lg[t][i])]
                                        for i in top],
                              "lse": lse(lg[t]), "experts": routed[t]})
        seq, greedy = list(ids), []
        last = lg[-1]
        for g in range(a.greedy):
            nxt = int(np.argmax(last))
            greedy.append(nxt)
            if g + 1 < a.greedy:
                seq.append(nxt)
                last = m.forward(seq)[0][-1]
        prompts.append({"ids": ids, "positions": positions,
                        "greedy_f32": greedy})
    ref = {"model": os.path.basename(os.path.normpath(a.model)),
           "format": 1,
           "sources": {"positions/greedy_f32/experts":
                       "scripts/moe-reference.py: numpy float64 forward "
                       "pass over the checkpoint's BF16 weights"
                       + (" (shared experts through FP8 E4M3, per-128 "
                          "scales)" if a.shared_experts == "fp8" else "")},
           "tolerances": {"f32": {
               "logit_abs": 3e-4, "lse_abs": 3e-4,
               "applies_to": "exact BF16 weights widened to F32, F32 "
                             "activations and KV cache",
               "derivation": "the tiny fixtures' f32 tolerance"}},
           "prompts": prompts}
    out = a.out or os.path.join(a.model, "reference.json")
    with open(out, "w") as f:
        json.dump(ref, f)
        f.write("\n")
    sys.stderr.write("moe-reference: %d prompts -> %s\n" % (len(prompts), out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
