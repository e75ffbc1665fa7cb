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

Usage: gen-v41-engram-model.py OUT_DIR [--table-gib 2] [--seed 1]
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
            "n_routed_experts": EXPERTS, "n_shared_experts": 0,
            "num_experts_per_tok": TOPK, "moe_intermediate_size": INTER,
            "engram_layer_ids": [1], "engram_num_embeddings": [rows],
            "engram_max_ngram_size": NGRAM, "engram_n_heads": HEADS,
            "engram_head_dim": DIM, "engram_pad_id": 2,
            "engram_compressed_vocab_size": VOCAB,
            "num_nextn_predict_layers": 0,
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
    ap.add_argument("--tokenizer-from", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
        "fixtures", "models", "tiny-deepseek-v41"))
    a = ap.parse_args()
    rows = int(a.table_gib * (1 << 30)) // (DIM + DIM // 32)
    os.makedirs(a.out, exist_ok=True)
    ts = tensors(rows)
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
            for b in chunks(kind, n, rng):
                f.write(b)
                done += len(b)
                if n > (256 << 20):
                    sys.stderr.write("\rgen-v41-engram-model: %.1f / %.1f GiB"
                                     % (done / 2**30, off / 2**30))
    os.rename(path + ".tmp", path)
    sys.stderr.write("\n")
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(rows), f, indent=1)
    with open(os.path.join(a.out, "engram_hash.json"), "w") as f:
        json.dump(hash_json(rows), f)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer_from, fn), a.out)
    print("%s: %d Engram rows x %d B = %.2f GiB (table), checkpoint %.2f GiB"
          % (a.out, rows, DIM + DIM // 32, rows * 264 / 2**30, off / 2**30))


if __name__ == "__main__":
    main()
