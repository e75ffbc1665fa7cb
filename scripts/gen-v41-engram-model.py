#!/usr/bin/python3
"""Write a DeepSeek-V4.1-shaped checkpoint whose Engram table is real-sized,
for benchmarking expertd's Engram tier (bench/bench_engram.c,
scripts/bench-engram.sh).

Everything except the Engram table is as small as a valid V4.1 checkpoint
allows (hidden 32, 2 layers, 4 MXFP4 experts, vocabulary 1024); the one
Engram layer (layer 1) has the real row shape of V4.1-Flash: 256 E4M3
columns plus 8 E8M0 scales per row (264 bytes), 8 heads x 3 n-gram sizes,
and --table-gib of rows (default 2 GiB, 8.1 M rows: larger than the host
cache the benchmark gives expertd).  engram_hash.json is consistent with the
config (its 24 table sizes sum to engram_num_embeddings); the sizes are not
primes and the token map is the identity, which only matters for the hash,
not for the I/O being measured.  Codes are random: E4M3 bytes without the
NaN codes 0x7f/0xff, E8M0 bytes 116..124.  tokenizer.json and
tokenizer_config.json are copied from --tokenizer-from (default: the
tiny-deepseek-v41 fixture).

With --flash-layers N (issue 11: the V4.1 serving benchmark,
bench/strata-bench-dsv) it writes a V4.1-Flash-shaped model instead:
every layer has the real per-layer shapes and formats of
../shared/MODEL_FAMILY_DEEPSEEK_V4.md 3.1-3.2 (hidden 5120, 64 heads of
512, q_lora 1280, o_groups 8 x 1024, FP8 E4M3 dense in 32 x 32 blocks, mHC
with 4 streams, 2304-wide MXFP4 experts of 17.93 MiB, top-6, indexers of
32 x 128, Engram rows of 256 E4M3 + 8 E8M0 with wkv [25600, 6144]), but N
layers (ratios 0, 0, then 2 and 1 as the release's encoder / decoder;
the first ratio-2 and the first ratio-1 layer are KV and index sources,
the latter the candidate source), --experts routed experts per layer,
two Engram layers (1 and N / 2) sharing --table-gib of rows, and a
--vocab-size vocabulary (the LM head is not per-layer).  Weights are well
scaled so that the activations stay finite and routing varies: FP8 codes
are a normal draw rounded to E4M3 with a block scale making each matrix's
elements of standard deviation 1/sqrt(in), FP4 nibbles uniform with a
scale of the same aim, BF16 normal draws, norms one.

Usage: gen-v41-engram-model.py OUT_DIR [--table-gib 2] [--seed 1]
       gen-v41-engram-model.py OUT_DIR --flash-layers 4 [--experts 24]
                               [--vocab-size 4096] [--table-gib 2]
Needs numpy: run with /usr/bin/python3 (Debian python3-numpy).  Writes in
chunks; memory stays small.
"""

import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

HIDDEN, LAYERS, EXPERTS, TOPK, INTER, VOCAB = 32, 2, 4, 2, 32, 1024
DIM, HEADS, NGRAM = 256, 8, 4


def config(rows):
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                "scale_fmt": "ue8m0",
                                "weight_block_size": [32, 32]},
        "text_config": {
            "model_type": "deepseek_v41_text",
            "vocab_size": VOCAB, "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS, "num_attention_heads": 1,
            "num_key_value_heads": 1, "head_dim": 64,
            "max_position_embeddings": 65536,
            "n_routed_experts": EXPERTS, "n_shared_experts": 1,
            "num_experts_per_tok": TOPK, "moe_intermediate_size": INTER,
            "engram_layer_ids": [1], "engram_num_embeddings": [rows],
            "engram_max_ngram_size": NGRAM, "engram_n_heads": HEADS,
            "engram_head_dim": DIM, "engram_pad_id": 2,
            "engram_vocab_size": VOCAB,
            "engram_compressed_vocab_size": VOCAB,
            "num_nextn_predict_layers": 0,
            # the rest of the V4.1 key set (st_config_dsv41 reads every
            # key, also for the store): window-only layers, so no
            # attention tensors are implied beyond what tensors() writes
            "qk_rope_head_dim": 16, "q_lora_rank": 32, "o_groups": 1,
            "o_lora_rank": 32, "sliding_window": 128,
            "compress_ratios": [0] * LAYERS, "kv_source_layer_ids": [],
            "index_source_layer_ids": [], "candidate_topk_blocks": 1,
            "candidate_block_size": 8, "index_n_heads": 1,
            "index_head_dim": 32, "index_topk": 8,
            "scoring_func": "sqrtsoftplus", "gate_temp": 1.0,
            "norm_topk_prob": True, "routed_scaling_factor": 1.5,
            "topk_method": "noaux_tc", "swiglu_limit": 10.0, "hc_mult": 4,
            "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-20,
            "rope_theta": 10000, "compress_rope_theta": 160000,
            "rope_scaling": {"rope_type": "yarn", "factor": 16,
                             "original_max_position_embeddings": 65536},
        },
    }


def hash_json(rows):
    n = (NGRAM - 1) * HEADS
    sizes = [rows // n] * n
    sizes[-1] += rows - sum(sizes)
    offs, acc = [], 0
    for s in sizes:
        offs.append(acc)
        acc += s
    lim = (2**63 - 1) // VOCAB
    mult = [[(lim // (7 + 2 * i)) | 1 for i in range(NGRAM)]]
    return {
        "compressed_vocab_size": VOCAB, "compressed_pad_id": 2,
        "pad_token_id": 2, "layer_ids": [1], "max_ngram_size": NGRAM,
        "n_heads": HEADS, "multipliers": mult,
        "primes": [[sizes[k * HEADS:(k + 1) * HEADS]
                    for k in range(NGRAM - 1)]],
        "offsets": [offs], "token_map": list(range(VOCAB)),
    }


def tensors(rows):
    """(name, dtype, shape, generator kind) in name order."""
    t = [("embed.weight", "BF16", [VOCAB, HIDDEN], "bf16"),
         ("head.weight", "BF16", [VOCAB, HIDDEN], "bf16"),
         ("norm.weight", "BF16", [HIDDEN], "one")]
    for l in range(LAYERS):
        p = "layers.%d." % l
        t += [(p + "attn_norm.weight", "BF16", [HIDDEN], "one"),
              (p + "ffn_norm.weight", "BF16", [HIDDEN], "one"),
              (p + "ffn.gate.weight", "BF16", [EXPERTS, HIDDEN], "bf16"),
              (p + "ffn.gate.bias", "F32", [EXPERTS], "zero")]
        for e in range(EXPERTS):
            for w, (o, i) in (("w1", (INTER, HIDDEN)), ("w3", (INTER, HIDDEN)),
                              ("w2", (HIDDEN, INTER))):
                q = p + "ffn.experts.%d.%s." % (e, w)
                t += [(q + "weight", "I8", [o, i // 2], "u8"),
                      (q + "scale", "F8_E8M0", [o, i // 32], "e8m0")]
    t += [("layers.1.engram.embed.weight", "F8_E4M3", [rows, DIM], "e4m3"),
          ("layers.1.engram.embed.scale", "F8_E8M0", [rows, DIM // 32],
           "e8m0")]
    return sorted(t)


ITEM = {"BF16": 2, "F32": 4, "I8": 1, "F8_E8M0": 1, "F8_E4M3": 1}

# V4.1-Flash per-layer shapes (MODEL_FAMILY_DEEPSEEK_V4.md 3.1)
F = dict(D=5120, H=64, HD=512, ROPE=64, QL=1280, OG=8, OL=1024, W=128,
         IH=32, ID=128, ITOPK=512, CB=2048, CBS=8, INTER=2304, TOPK=6,
         HC=4, EH=8, NG=4, EDIM=256)


def e4m3_table():
    """Values of the positive E4M3 codes 0x00..0x7e (increasing)."""
    v = []
    for b in range(0x7f):
        e, m = b >> 3, b & 7
        v.append(m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0**(e - 7))
    return np.array(v)


E4M3 = e4m3_table()
E4M3_MID = (E4M3[1:] + E4M3[:-1]) / 2


def flash_schedule(n):
    """compress ratios, KV sources, index sources, candidate source,
    Engram layers of an n-layer V4.1-Flash-shaped model."""
    n2 = (n - 2) // 2
    ratios = [0, 0] + [2] * n2 + [1] * (n - 2 - n2)
    src = [2, 2 + n2]
    return ratios, src, src, 2 + n2, [1, n // 2]


def flash_config(a, rows):
    ratios, kv, idx, cand, eng = flash_schedule(a.flash_layers)
    c = config(rows[0])
    t = c["text_config"]
    t.update({
        "vocab_size": a.vocab_size, "hidden_size": F["D"],
        "num_hidden_layers": a.flash_layers,
        "num_attention_heads": F["H"], "head_dim": F["HD"],
        "qk_rope_head_dim": F["ROPE"], "q_lora_rank": F["QL"],
        "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"rope_type": "yarn", "factor": 16,
                         "original_max_position_embeddings": 65536},
        "max_position_embeddings": 65536, "sliding_window": F["W"],
        "compress_ratios": ratios, "kv_source_layer_ids": kv,
        "index_source_layer_ids": idx, "candidate_source_layer_id": cand,
        "candidate_topk_blocks": F["CB"], "candidate_block_size": F["CBS"],
        "index_n_heads": F["IH"], "index_head_dim": F["ID"],
        "index_topk": F["ITOPK"], "o_groups": F["OG"],
        "o_lora_rank": F["OL"], "moe_intermediate_size": F["INTER"],
        "n_routed_experts": a.experts, "n_shared_experts": 1,
        "num_experts_per_tok": F["TOPK"], "scoring_func": "sqrtsoftplus",
        "gate_temp": 1.0, "norm_topk_prob": True,
        "routed_scaling_factor": 1.5, "topk_method": "noaux_tc",
        "swiglu_limit": 10.0, "hc_mult": F["HC"], "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6, "rms_norm_eps": 1e-20, "engram_layer_ids": eng,
        "engram_num_embeddings": rows, "engram_max_ngram_size": F["NG"],
        "engram_n_heads": F["EH"], "engram_head_dim": F["EDIM"],
        "engram_vocab_size": a.vocab_size,
        "engram_compressed_vocab_size": a.vocab_size,
    })
    return c


def flash_hash(a, rows):
    eng = flash_schedule(a.flash_layers)[4]
    hs = [hash_json(r) for r in rows]
    h = hs[0]
    h["layer_ids"] = eng
    h["multipliers"] = [x["multipliers"][0] for x in hs]
    h["primes"] = [x["primes"][0] for x in hs]
    h["offsets"] = [x["offsets"][0] for x in hs]
    h["compressed_vocab_size"] = a.vocab_size
    h["token_map"] = list(range(a.vocab_size))
    return h


def fp8(name, rows, cols):
    """An FP8 matrix: weight codes ("fp8:<cols>": std 1/sqrt(cols)) and
    its 32 x 32 block scales."""
    return [(name + ".weight", "F8_E4M3", [rows, cols], "fp8:%d" % cols),
            (name + ".scale", "F8_E8M0", [-(-rows // 32), -(-cols // 32)],
             "s8:%d" % cols)]


def flash_tensors(a, rows):
    D, HC = F["D"], F["HC"]
    ratios, kv, idx, cand, eng = flash_schedule(a.flash_layers)
    V = a.vocab_size
    t = [("embed.weight", "BF16", [V, D], "bf16:1"),
         ("head.weight", "BF16", [V, D], "bf16:%d" % D),
         ("norm.weight", "BF16", [D], "one")]
    for l in range(a.flash_layers):
        p = "layers.%d." % l
        nmu = (2 + HC) * HC
        t += [(p + "attn_norm.weight", "BF16", [D], "one"),
              (p + "ffn_norm.weight", "BF16", [D], "one"),
              (p + "attn.q_norm.weight", "BF16", [F["QL"]], "one"),
              (p + "attn.kv_norm.weight", "BF16", [F["HD"]], "one"),
              (p + "attn.attn_sink", "F32", [F["H"]], "zero"),
              (p + "ffn.gate.weight", "BF16", [a.experts, D],
               "bf16:%d" % D),
              (p + "ffn.gate.bias", "F32", [a.experts], "zero")]
        for site in ("attn", "ffn"):
            t += [(p + "hc_%s_fn" % site, "F32", [nmu, HC * D],
                   "f32:%d" % (HC * D)),
                  (p + "hc_%s_base" % site, "F32", [nmu], "zero"),
                  (p + "hc_%s_scale" % site, "F32", [3], "f32one")]
        t += fp8(p + "attn.wq_a", F["QL"], D)
        t += fp8(p + "attn.wq_b", F["H"] * F["HD"], F["QL"])
        t += fp8(p + "attn.wkv", F["HD"], D)
        t += fp8(p + "attn.wo_a", F["OG"] * F["OL"],
                 F["H"] // F["OG"] * F["HD"])
        t += fp8(p + "attn.wo_b", D, F["OG"] * F["OL"])
        t += fp8(p + "ffn.shared_experts.w1", F["INTER"], D)
        t += fp8(p + "ffn.shared_experts.w3", F["INTER"], D)
        t += fp8(p + "ffn.shared_experts.w2", D, F["INTER"])
        if l in kv:
            t += [(p + "attn.compressor.wkv.weight", "BF16", [F["HD"], D],
                   "bf16:%d" % D),
                  (p + "attn.compressor.norm.weight", "BF16", [F["HD"]],
                   "one"),
                  (p + "attn.indexer.wk.weight", "BF16", [F["ID"], F["HD"]],
                   "bf16:%d" % F["HD"]),
                  (p + "attn.indexer.k_norm.weight", "BF16", [F["ID"]],
                   "one")]
            if ratios[l] > 1:
                t.append((p + "attn.compressor.wgate.weight", "BF16",
                          [F["HD"], D], "bf16:%d" % D))
        if l in idx:
            t += fp8(p + "attn.indexer.wq_b", F["IH"] * F["ID"], F["QL"])
            t.append((p + "attn.indexer.weights_proj.weight", "BF16",
                      [F["IH"], D], "bf16:%d" % D))
        if l in eng:
            ei = eng.index(l)
            rpp = (F["NG"] - 1) * F["EH"]
            t += [(p + "engram.embed.weight", "F8_E4M3",
                   [rows[ei], F["EDIM"]], "e4m3"),
                  (p + "engram.embed.scale", "F8_E8M0",
                   [rows[ei], F["EDIM"] // 32], "e8m0"),
                  (p + "engram.q_weight", "BF16", [HC, D], "one"),
                  (p + "engram.k_weight", "BF16", [HC, D], "one")]
            t += fp8(p + "engram.wkv", (HC + 1) * D, rpp * F["EDIM"])
        for e in range(a.experts):
            for w, (o, i) in (("w1", (F["INTER"], D)),
                              ("w3", (F["INTER"], D)),
                              ("w2", (D, F["INTER"]))):
                q = p + "ffn.experts.%d.%s." % (e, w)
                t += [(q + "weight", "I8", [o, i // 2], "u8"),
                      (q + "scale", "F8_E8M0", [o, i // 32], "s4:%d" % i)]
    return sorted(t)


def scaled_chunks(kind, n, rng):
    """The --flash-layers kinds: "fp8:IN", "s8:IN", "s4:IN", "bf16:IN",
    "f32:IN", "f32one" (others: chunks())."""
    k, _, arg = kind.partition(":")
    fan = int(arg) if arg else 1
    step = 32 << 20
    for a in range(0, n, step):
        m = min(step, n - a)
        if k == "fp8":  # N(0, 16^2) rounded to E4M3
            f = rng.standard_normal(m, dtype=np.float32) * 16
            c = np.minimum(np.searchsorted(E4M3_MID, np.abs(f)), 0x7e)
            b = (c | ((f < 0) << 7)).astype(np.uint8)
        elif k == "s8":  # 16 x 2^e ~ 1/sqrt(IN)
            e = int(round(np.log2(1 / (16 * np.sqrt(fan)))))
            b = np.full(m, 127 + e, dtype=np.uint8)
        elif k == "s4":  # uniform nibbles: rms 2.93
            e = int(round(np.log2(1 / (2.93 * np.sqrt(fan)))))
            b = np.full(m, 127 + e, dtype=np.uint8)
        elif k == "bf16":
            f = rng.standard_normal(m // 2, dtype=np.float32) / np.sqrt(fan)
            b = (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        elif k == "f32":
            f = rng.standard_normal(m // 4, dtype=np.float32) / np.sqrt(fan)
            b = f.view(np.uint8)
        elif k == "f32one":
            b = np.ones(m // 4, dtype=np.float32).view(np.uint8)
        else:
            yield from chunks(kind, m, rng)
            continue
        yield b.tobytes()


def chunks(kind, n, rng):
    step = 64 << 20
    for a in range(0, n, step):
        m = min(step, n - a)
        if kind == "e4m3":
            b = rng.integers(0, 256, m, dtype=np.uint8)
            b[b == 0x7f] = 0x7e
            b[b == 0xff] = 0xfe
        elif kind == "e8m0":
            b = rng.integers(116, 125, m, dtype=np.uint8)
        elif kind == "u8":
            b = rng.integers(0, 256, m, dtype=np.uint8)
        elif kind == "bf16":
            f = (rng.standard_normal(m // 2) * 0.3).astype(np.float32)
            b = (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        elif kind == "one":
            b = np.full(m // 2, 0x3f80, dtype=np.uint16).view(np.uint8)
        else:
            b = np.zeros(m, dtype=np.uint8)
        yield b.tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--table-gib", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--flash-layers", type=int, default=0,
                    help="V4.1-Flash per-layer shapes, this many layers "
                    "(>= 4)")
    ap.add_argument("--experts", type=int, default=24,
                    help="routed experts per layer (--flash-layers)")
    ap.add_argument("--vocab-size", type=int, default=4096,
                    help="vocabulary (--flash-layers)")
    ap.add_argument("--tokenizer-from", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
        "fixtures", "models", "tiny-deepseek-v41"))
    a = ap.parse_args()
    rows = int(a.table_gib * (1 << 30)) // (DIM + DIM // 32)
    if a.flash_layers:
        if a.flash_layers < 4 or a.experts < F["TOPK"] or a.vocab_size < 256:
            ap.error("--flash-layers >= 4, --experts >= 6, --vocab-size "
                     ">= 256")
        rows = [rows // 2, rows - rows // 2]
    os.makedirs(a.out, exist_ok=True)
    ts = flash_tensors(a, rows) if a.flash_layers else tensors(rows)
    hdr, off = {}, 0
    for name, dt, shape, _ in ts:
        n = ITEM[dt]
        for s in shape:
            n *= s
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    rng = np.random.default_rng(a.seed)
    path = os.path.join(a.out, "model.safetensors")
    done = 0
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, dt, shape, kind in ts:
            n = hdr[name]["data_offsets"][1] - hdr[name]["data_offsets"][0]
            for b in (scaled_chunks if a.flash_layers else chunks)(
                    kind, n, rng):
                f.write(b)
                done += len(b)
                if n > (256 << 20):
                    sys.stderr.write("\rgen-v41-engram-model: %.1f / %.1f GiB"
                                     % (done / 2**30, off / 2**30))
    os.rename(path + ".tmp", path)
    sys.stderr.write("\n")
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(flash_config(a, rows) if a.flash_layers else config(rows),
                  f, indent=1)
    with open(os.path.join(a.out, "engram_hash.json"), "w") as f:
        json.dump(flash_hash(a, rows) if a.flash_layers else hash_json(rows),
                  f)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer_from, fn), a.out)
    nr = sum(rows) if a.flash_layers else rows
    print("%s: %d Engram rows x %d B = %.2f GiB (tables), checkpoint %.2f GiB"
          % (a.out, nr, DIM + DIM // 32, nr * 264 / 2**30, off / 2**30))


if __name__ == "__main__":
    main()
