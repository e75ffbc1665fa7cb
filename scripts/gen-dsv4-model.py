#!/usr/bin/python3
"""Write a random-weight DeepSeek-V4-Flash-shaped checkpoint in the official
storage format.

strata's V4 tier benchmark needs a model whose experts have the real size
(12.75 MiB per MXFP4 expert record) and whose layers have the real shapes,
but not all 284 G parameters.  This script writes such a model: the tensor
names, dtypes and shapes of ../shared/MODEL_FAMILY_DEEPSEEK_V4.md section 2.3
(the same as ../shared/fixtures/models/tiny-deepseek-v4):

  FP8 dense     <name>.weight F8_E4M3 [out, in] + <name>.scale F8_E8M0
                [ceil(out/128), ceil(in/128)] (block 128 x 128)
  FP4 experts   ffn.experts.E.w{1,3,2}.weight I8 [out, in/2] (OCP nibble
                order: low nibble = even element) + .scale F8_E8M0 [out, in/32]
  BF16          embed, head, norms, router gate, compressors, weights_proj
  F32           hc_* (mHC), attn_sink, ape, gate.bias
  I64           layers.{0..num_hash_layers-1}.ffn.gate.tid2eid [vocab, top_k]

and a config.json with the real V4-Flash key set (no expert_dtype: the
fixture's README says the verbatim release config has none), with fewer
layers (--layers; compress_ratios follow the release pattern 0, 0, 4, 128,
4, 128, ...) and/or fewer routed experts per layer (--experts), or
--fraction F of the real routed-expert bytes (43 x 256 experts).  No MTP
block is written (num_nextn_predict_layers 0; strata skips mtp.* anyway).
--small writes tiny shapes (hidden 64, 4 layers, 8 experts) for CI tests.

Weights are random but well scaled: every FP8 / FP4 code is drawn from the
codes of a normal distribution rounded to the format (lookup tables over
random integers, so generation runs at memory speed), scales are powers of
two chosen so that a matrix [out, in] has elements of standard deviation
about 1/sqrt(in) (router 1.5/sqrt(in), LM head 2/sqrt(in)), with a random
+-1 exponent jitter per scale block; BF16/F32 tensors are normal draws.
Each tensor has its own numpy default_rng stream seeded from
sha256("<seed>:<name>"), so its bytes depend only on the seed, its name and
its shape.

The model is written tensor by tensor, in chunks (no tensor is held whole
in memory), into shards of at most --shard-size bytes with
model.safetensors.index.json when there are several.  The tokenizer files
are copied from --tokenizer-from (default: the tiny-deepseek-v4 fixture,
the DeepSeek-V3 tokenizer), because strata convert requires them.

Only numpy is needed (Debian's python3-numpy; run with /usr/bin/python3).
"""

import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import sys
import time

try:
    import numpy as np
except ImportError:  # pragma: no cover - reported to the user
    sys.stderr.write("gen-dsv4-model.py: numpy is required "
                     "(run with /usr/bin/python3 and python3-numpy)\n")
    sys.exit(2)

CHUNK = 1 << 23  # elements per generation step (memory bound, not output)

# DeepSeek-V4-Flash (MODEL_FAMILY_DEEPSEEK_V4.md 2.1).
REAL = dict(hidden=4096, layers=43, heads=64, head_dim=512, rope_dim=64,
            q_lora=1024, o_groups=8, o_lora=1024, window=128,
            index_heads=64, index_dim=128, index_topk=512, experts=256,
            top_k=6, moe_inter=2048, vocab=129280, hash_layers=3,
            block=128, csa=4, hca=128, swiglu_limit=10.0,
            orig_max_pos=65536, max_pos=1048576)

# CI-sized: every feature, tiny shapes (multiples of 32 for FP4 groups).
SMALL = dict(REAL, hidden=64, layers=4, heads=4, head_dim=64, rope_dim=16,
             q_lora=96, o_groups=2, o_lora=32, window=16, index_heads=4,
             index_dim=32, index_topk=4, experts=8, top_k=2, moe_inter=64,
             vocab=129280, hash_layers=3, block=32, csa=4, hca=16,
             swiglu_limit=10.0, orig_max_pos=4096, max_pos=65536)

REAL_EXPERT_LAYERS = 43
REAL_EXPERTS = 256


def log(msg):
    sys.stderr.write("gen-dsv4-model: %s\n" % msg)
    sys.stderr.flush()


def tensor_seed(seed, name):
    digest = hashlib.sha256(("%d:%s" % (seed, name)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


# --- format tables ----------------------------------------------------------

def e4m3_values():
    """Float value of each E4M3FN byte (NaN for 0x7F / 0xFF)."""
    v = np.zeros(256, np.float64)
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v[b] = np.nan
            continue
        mag = (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        v[b] = -mag if b & 0x80 else mag
    return v


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def code_lut(values, sigma, bits, rng):
    """A table of 2^bits codes whose frequencies follow N(0, sigma^2)
    rounded to the nearest representable value (values[code], NaN codes
    excluded): indexing it with uniform random integers draws codes with
    that distribution."""
    n = 1 << bits
    ok = [c for c in range(len(values)) if not math.isnan(values[c])]
    vals = np.array([values[c] for c in ok])
    order = np.argsort(vals, kind="stable")
    sv = vals[order]
    # probability mass of each code: the normal's mass between midpoints
    mids = (sv[1:] + sv[:-1]) / 2
    cdf = np.concatenate(([0.0], 0.5 * (1 + np.vectorize(math.erf)(
        mids / (sigma * math.sqrt(2)))), [1.0]))
    p = np.diff(cdf)
    counts = np.floor(p * n).astype(np.int64)
    # largest remainders get the leftover entries
    rem = n - counts.sum()
    counts[np.argsort(-(p * n - counts), kind="stable")[:rem]] += 1
    lut = np.repeat(np.array(ok)[order], counts).astype(np.uint8)
    assert len(lut) == n
    return lut


class Codes:
    """The code tables, built once."""

    def __init__(self):
        rng = np.random.default_rng(1)
        # E4M3: sigma 16 keeps 5 sigma (80) well inside 448 and few codes
        # subnormal
        self.fp8 = code_lut(list(e4m3_values()), 16.0, 16, rng)
        nib = [v for v in E2M1] + [-v for v in E2M1]
        self.fp4 = code_lut(nib, 2.0, 8, rng)  # 16 nibble codes
        self.fp8_sigma, self.fp4_sigma = 16.0, 2.0


# --- tensor plan ------------------------------------------------------------

def ratio_of(a, layer):
    """compress_ratios of the release: 0, 0, then CSA / HCA alternating."""
    if layer < 2:
        return 0
    return a.csa if layer % 2 == 0 else a.hca


def plan(a):
    """(name, dtype, shape, kind, param) in writing order.  kinds:
    normal (std), norm ((mean, std)), uniform ((lo, hi)), fp8w / fp8s
    (std of the dequantised weight, in), fp4w / fp4s (same), tid2eid."""
    D, H, hd, hc = a.hidden, a.heads, a.head_dim, 4
    t = []
    mat = lambda g, fin: g / math.sqrt(fin)

    def fp8(name, out, fin, g=1.0):
        t.append((name + ".weight", "F8_E4M3", (out, fin), "fp8w", None))
        t.append((name + ".scale", "F8_E8M0",
                  (-(-out // a.block), -(-fin // a.block)), "fp8s",
                  mat(g, fin)))

    def fp4(name, out, fin):
        t.append((name + ".weight", "I8", (out, fin // 2), "fp4w", None))
        t.append((name + ".scale", "F8_E8M0", (out, fin // 32), "fp4s",
                  mat(1.0, fin)))

    t.append(("embed.weight", "BF16", (a.vocab, D), "normal", 1.0))
    t.append(("head.weight", "BF16", (a.vocab, D), "normal", mat(2.0, D)))
    t.append(("norm.weight", "BF16", (D,), "norm", (1.0, 0.15)))
    t.append(("hc_head_fn", "F32", (hc, hc * D), "normal",
              0.66 / math.sqrt(hc * D)))
    t.append(("hc_head_base", "F32", (hc,), "normal", 0.45))
    t.append(("hc_head_scale", "F32", (1,), "uniform", (0.6, 1.35)))
    nmu = (2 + hc) * hc
    for n in range(a.layers):
        p = "layers.%d." % n
        r = ratio_of(a, n)
        t.append((p + "attn_norm.weight", "BF16", (D,), "norm", (1.0, 0.15)))
        t.append((p + "ffn_norm.weight", "BF16", (D,), "norm", (1.0, 0.15)))
        for s in ("attn", "ffn"):
            t.append((p + "hc_%s_fn" % s, "F32", (nmu, hc * D), "normal",
                      0.66 / math.sqrt(hc * D)))
            t.append((p + "hc_%s_base" % s, "F32", (nmu,), "normal", 0.8))
            t.append((p + "hc_%s_scale" % s, "F32", (3,), "uniform",
                      (0.6, 1.35)))
        fp8(p + "attn.wq_a", a.q_lora, D)
        t.append((p + "attn.q_norm.weight", "BF16", (a.q_lora,), "norm",
                  (1.0, 0.15)))
        fp8(p + "attn.wq_b", H * hd, a.q_lora)
        fp8(p + "attn.wkv", hd, D)
        t.append((p + "attn.kv_norm.weight", "BF16", (hd,), "norm",
                  (1.0, 0.15)))
        fp8(p + "attn.wo_a", a.o_groups * a.o_lora, H // a.o_groups * hd)
        fp8(p + "attn.wo_b", D, a.o_groups * a.o_lora)
        t.append((p + "attn.attn_sink", "F32", (H,), "normal", 1.0))
        if r:
            w = 2 * hd if r == 4 else hd
            c = p + "attn.compressor."
            t.append((c + "wkv.weight", "BF16", (w, D), "normal", mat(1, D)))
            t.append((c + "wgate.weight", "BF16", (w, D), "normal",
                      mat(1, D)))
            t.append((c + "ape", "F32", (r, w), "normal", 0.7))
            t.append((c + "norm.weight", "BF16", (hd,), "norm", (1.0, 0.15)))
        if r == 4:
            i = p + "attn.indexer."
            fp8(i + "wq_b", a.index_heads * a.index_dim, a.q_lora)
            t.append((i + "weights_proj.weight", "BF16", (a.index_heads, D),
                      "normal", mat(1, D)))
            w = 2 * a.index_dim
            t.append((i + "compressor.wkv.weight", "BF16", (w, D), "normal",
                      mat(1, D)))
            t.append((i + "compressor.wgate.weight", "BF16", (w, D),
                      "normal", mat(1, D)))
            t.append((i + "compressor.ape", "F32", (4, w), "normal", 0.7))
            t.append((i + "compressor.norm.weight", "BF16", (a.index_dim,),
                      "norm", (1.0, 0.15)))
        t.append((p + "ffn.gate.weight", "BF16", (a.experts, D), "normal",
                  mat(1.5, D)))
        if n < a.hash_layers:
            t.append((p + "ffn.gate.tid2eid", "I64", (a.vocab, a.top_k),
                      "tid2eid", a.experts))
        else:
            t.append((p + "ffn.gate.bias", "F32", (a.experts,), "normal",
                      0.1))
        fp8(p + "ffn.shared_experts.w1", a.moe_inter, D)
        fp8(p + "ffn.shared_experts.w2", D, a.moe_inter)
        fp8(p + "ffn.shared_experts.w3", a.moe_inter, D)
        for e in range(a.experts):
            q = p + "ffn.experts.%d." % e
            fp4(q + "w1", a.moe_inter, D)
            fp4(q + "w2", D, a.moe_inter)
            fp4(q + "w3", a.moe_inter, D)
    return t


ITEM = {"F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "BF16": 2, "F32": 4, "I64": 8}


def nbytes(tensor):
    n = ITEM[tensor[1]]
    for d in tensor[2]:
        n *= d
    return n


def shards_of(tensors, shard_size):
    """Greedy shards of at most shard_size data bytes; inside a shard the
    tensors go larger item size first (every offset aligned to its item
    size, as the release and the fixture do), each (weight, scale) pair
    kept together in one shard."""
    shards, cur, cur_b = [], [], 0
    i = 0
    while i < len(tensors):
        grp = [tensors[i]]
        if tensors[i][3] in ("fp8w", "fp4w"):
            grp.append(tensors[i + 1])
        b = sum(nbytes(x) for x in grp)
        if cur and cur_b + b > shard_size:
            shards.append(cur)
            cur, cur_b = [], 0
        cur += grp
        cur_b += b
        i += len(grp)
    if cur:
        shards.append(cur)
    return [sorted(s, key=lambda x: -ITEM[x[1]]) for s in shards]


# --- writing ----------------------------------------------------------------

def bf16_bits(x):
    """float32 array -> BF16 bit patterns, round to nearest even."""
    u = x.view(np.uint32)
    u = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (u >> np.uint32(16)).astype(np.uint16)


def scale_byte(std, code_sigma):
    """E8M0 byte of the power of two taking codes of std code_sigma to
    elements of std `std`."""
    return int(round(math.log2(std / code_sigma))) + 127


def write_tensor(f, codes, seed, t):
    name, dt, shape, kind, param = t
    rng = np.random.default_rng(tensor_seed(seed, name))
    total = 1
    for d in shape:
        total *= d
    if kind == "tid2eid":
        E = param
        rows, k = shape
        step = max(1, CHUNK // (k * 8))
        for r0 in range(0, rows, step):
            n = min(step, rows - r0)
            # k distinct ids per row: the first k of a random permutation,
            # drawn as the k smallest of E uniform keys
            keys = rng.random((n, E), dtype=np.float32)
            ids = np.argpartition(keys, k - 1, axis=1)[:, :k]
            f.write(ids.astype("<i8").tobytes())
        return
    if kind in ("fp8s", "fp4s"):
        sigma = codes.fp8_sigma if kind == "fp8s" else codes.fp4_sigma
        base = scale_byte(param, sigma)
        jit = rng.integers(-1, 2, size=total, dtype=np.int16)
        f.write((base + jit).astype(np.uint8).tobytes())
        return
    done = 0
    while done < total:
        n = min(CHUNK, total - done)
        if kind == "fp8w":
            out = codes.fp8[rng.integers(0, 1 << 16, size=n,
                                         dtype=np.uint16)]
        elif kind == "fp4w":
            lo = codes.fp4[rng.integers(0, 256, size=n, dtype=np.uint8)]
            hi = codes.fp4[rng.integers(0, 256, size=n, dtype=np.uint8)]
            out = lo | (hi << np.uint8(4))
        else:
            if kind == "uniform":
                x = rng.uniform(param[0], param[1], n).astype(np.float32)
            else:
                x = rng.standard_normal(n, dtype=np.float32)
                if kind == "normal":
                    x *= np.float32(param)
                else:
                    x = x * np.float32(param[1]) + np.float32(param[0])
            out = bf16_bits(x) if dt == "BF16" else x.astype("<f4")
        f.write(out.tobytes())
        done += n


def header(shard):
    hdr = {"__metadata__": {"format": "pt",
                            "generator": "strata gen-dsv4-model.py"}}
    off = 0
    for t in shard:
        b = nbytes(t)
        hdr[t[0]] = {"dtype": t[1], "shape": list(t[2]),
                     "data_offsets": [off, off + b]}
        off += b
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    return text, off


def write_config(a, path):
    ratios = [ratio_of(a, n) for n in range(a.layers)]
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "hc_eps": 1e-06,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "index_head_dim": a.index_dim,
        "index_n_heads": a.index_heads,
        "index_topk": a.index_topk,
        "initializer_range": 0.02,
        "max_position_embeddings": a.max_pos,
        "model_type": "deepseek_v4",
        "moe_intermediate_size": a.moe_inter,
        "n_routed_experts": a.experts,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": a.heads,
        "num_experts_per_tok": a.top_k,
        "num_hidden_layers": a.layers,
        "num_hash_layers": a.hash_layers,
        "num_key_value_heads": 1,
        "num_nextn_predict_layers": 0,
        "o_groups": a.o_groups,
        "o_lora_rank": a.o_lora,
        "q_lora_rank": a.q_lora,
        "qk_rope_head_dim": a.rope_dim,
        "quantization_config": {
            "activation_scheme": "dynamic", "fmt": "e4m3",
            "quant_method": "fp8", "scale_fmt": "ue8m0",
            "weight_block_size": [a.block, a.block]},
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                         "original_max_position_embeddings": a.orig_max_pos,
                         "type": "yarn"},
        "rope_theta": 10000,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "sliding_window": a.window,
        "swiglu_limit": a.swiglu_limit,
        "tie_word_embeddings": False,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1",
        "use_cache": True,
        "vocab_size": a.vocab,
        "compress_rope_theta": 160000,
        "compress_ratios": ratios,
    }
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def parse_size(text):
    units = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
             "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "kb": 1000,
             "mb": 1000 ** 2, "gb": 1000 ** 3}
    t = text.strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    if unit not in units or not num:
        raise argparse.ArgumentTypeError("not a size: %r" % text)
    return int(float(num) * units[unit])


def default_tokenizer_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "shared", "fixtures", "models",
                        "tiny-deepseek-v4")


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Write a random DeepSeek-V4-Flash-shaped checkpoint "
        "(official names and FP8/FP4 formats) with real per-layer shapes "
        "and fewer layers or experts.",
        epilog="Examples:\n"
        "  gen-dsv4-model.py --out bench-models/dsv4-6x64 --layers 6 "
        "--experts 64\n"
        "  gen-dsv4-model.py --out M --fraction 0.02   # 2 %% of the real "
        "routed-expert bytes\n"
        "  gen-dsv4-model.py --out M --small           # CI-sized\n"
        "Expert record (w1+w3+w2, MXFP4) at real shapes: 13,369,344 B "
        "(12.75 MiB).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--small", action="store_true",
                   help="tiny shapes (hidden 64, 4 layers, 8 experts) for "
                   "tests")
    p.add_argument("--layers", type=int, help="num_hidden_layers (real 43; "
                   "default 4, or as --fraction needs)")
    p.add_argument("--experts", type=int,
                   help="n_routed_experts per layer (real 256)")
    p.add_argument("--fraction", type=float,
                   help="routed-expert bytes as this fraction of the real "
                   "model's (43 x 256 experts): with --layers given, sets "
                   "--experts; else keeps 256 experts and sets --layers")
    p.add_argument("--vocab", type=int, help="vocab_size (real 129280)")
    p.add_argument("--top-k", type=int, help="num_experts_per_tok (real 6)")
    p.add_argument("--hash-layers", type=int,
                   help="num_hash_layers (real 3; at most --layers)")
    p.add_argument("--seed", type=int, default=20261129)
    p.add_argument("--shard-size", type=parse_size, default=4 << 30,
                   help="bytes per safetensors shard (default 4GiB)")
    p.add_argument("--tokenizer-from", metavar="DIR",
                   default=default_tokenizer_dir(),
                   help="copy tokenizer.json and tokenizer_config.json from "
                   "DIR (default: the tiny-deepseek-v4 fixture)")
    p.add_argument("--force", action="store_true",
                   help="overwrite an existing checkpoint in --out")
    p.add_argument("--dry-run", action="store_true",
                   help="print the sizes and exit")
    a = p.parse_args(argv)
    base = SMALL if a.small else REAL
    for k, v in base.items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    if a.fraction is not None:
        if not 0 < a.fraction <= 1:
            p.error("--fraction must be in (0, 1]")
        want = a.fraction * REAL_EXPERT_LAYERS * REAL_EXPERTS
        if a.layers is not None and "--layers" in " ".join(argv):
            a.experts = max(a.top_k, int(round(want / a.layers)))
        else:
            a.experts = REAL_EXPERTS if not a.small else a.experts
            a.layers = max(1, int(round(want / a.experts)))
    elif "--layers" not in " ".join(argv) and not a.small:
        a.layers = 4
    if a.layers < 1 or a.layers > 128:
        p.error("--layers must be in [1, 128]")
    if a.experts < a.top_k:
        p.error("--experts must be at least --top-k (%d)" % a.top_k)
    a.hash_layers = min(a.hash_layers, a.layers)
    if a.hidden % 32 or a.moe_inter % 32:
        p.error("hidden and moe_inter must be multiples of 32 (FP4 groups)")
    return a


def main(argv):
    a = parse_args(argv)
    tensors = plan(a)
    rec = 3 * (a.moe_inter * a.hidden // 2 + a.moe_inter * a.hidden // 32)
    total = sum(nbytes(t) for t in tensors)
    n_exp = a.layers * a.experts
    log("%d layers x %d experts (%d routed experts, top-%d), hidden %d, "
        "vocab %d: expert record %d B (%.2f MiB), experts %.2f GiB, "
        "checkpoint %.2f GiB" % (a.layers, a.experts, n_exp, a.top_k,
                                 a.hidden, a.vocab, rec, rec / 2 ** 20,
                                 n_exp * rec / 2 ** 30, total / 2 ** 30))
    if a.dry_run:
        return 0
    tok = a.tokenizer_from
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(tok, fn)):
            log("%s has no %s: pass --tokenizer-from DIR (strata convert "
                "needs the tokenizer)" % (tok, fn))
            return 2
    os.makedirs(a.out, exist_ok=True)
    if os.path.exists(os.path.join(a.out, "config.json")) and not a.force:
        log("%s already holds a checkpoint; --force to overwrite" % a.out)
        return 2
    for fn in os.listdir(a.out):
        if fn.startswith("model") and (fn.endswith(".safetensors") or
                                       fn.endswith(".index.json")):
            os.unlink(os.path.join(a.out, fn))
    codes = Codes()
    shards = shards_of(tensors, a.shard_size)
    names = (["model.safetensors"] if len(shards) == 1 else
             ["model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
              for i in range(len(shards))])
    t0, written, last = time.time(), 0, 0.0
    weight_map = {}
    for sh, fn in zip(shards, names):
        text, data = header(sh)
        tmp = os.path.join(a.out, fn + ".tmp")
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for t in sh:
                write_tensor(f, codes, a.seed, t)
                weight_map[t[0]] = fn
                written += nbytes(t)
                now = time.time()
                if now - last > 5:
                    last = now
                    log("%.1f / %.1f GiB (%.0f MB/s)" % (
                        written / 2 ** 30, total / 2 ** 30,
                        written / 1e6 / max(now - t0, 1e-3)))
        os.rename(tmp, os.path.join(a.out, fn))
    if len(shards) > 1:
        with open(os.path.join(a.out, "model.safetensors.index.json"),
                  "w") as f:
            json.dump({"metadata": {"total_size": total},
                       "weight_map": weight_map}, f, indent=1)
    write_config(a, os.path.join(a.out, "config.json"))
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok, fn), os.path.join(a.out, fn))
    log("wrote %s: %.2f GiB in %.0f s" % (a.out, total / 2 ** 30,
                                          time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
