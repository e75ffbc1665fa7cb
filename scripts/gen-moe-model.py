#!/usr/bin/python3
"""Write a random-weight Qwen3-MoE or Qwen2-MoE checkpoint in Hugging Face
layout.

strata's benchmarks need a model large enough that expert residency matters
(the "large generated model": about 2 G parameters, 3.9 GB in BF16) without
downloading one.  This script writes such a model: config.json
(Qwen3MoeForCausalLM, model_type qwen3_moe), BF16 safetensors sharded into
files of at most --shard-size bytes (with model.safetensors.index.json when
there is more than one), and the tokenizer files copied from another model
directory (by default the tiny-qwen3moe fixture, which has the real Qwen3
vocabulary).

Tensor names and shapes follow /work/shared/MODEL_FAMILIES.md section 4.2
(Qwen3-MoE, the default) or 3.2 (--family qwen2_moe: q/k/v biases, no
q/k norm, one shared expert of --shared-inter with a sigmoid gate).
Weights are random but not degenerate (the scales of the fixtures' READMEs):
  matrices W [out, in]   N(0, (g / sqrt(in))^2), g = 1.0, router g = 1.5
  embeddings / lm_head   N(0, 0.35^2)
  RMSNorm weights        1 + 0.2 N(0, 1)
  q_norm / k_norm        1.4 + 0.25 N(0, 1)
  q/k/v biases           N(0, 0.1^2)
  shared_expert_gate     g = 1.0
Each tensor has its own numpy default_rng stream seeded with the first 8 bytes
(little-endian) of sha256("<seed>:<tensor name>"), so the bytes of a tensor
depend only on the seed, its name and its shape, not on the sharding or on
the order of writing.  float32 -> BF16 rounds to nearest even.

Only numpy is needed (Debian's python3-numpy; run with /usr/bin/python3).
The model is generated and written tensor by tensor, in chunks, so memory
stays small whatever the model size.
"""

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import struct
import sys
import time

try:
    import numpy as np
except ImportError:  # pragma: no cover - reported to the user
    sys.stderr.write("gen-moe-model.py: numpy is required "
                     "(run with /usr/bin/python3 and python3-numpy)\n")
    sys.exit(2)

# Elements generated per step: 8 Mi float32 = 32 MiB of scratch, plus the
# 16 MiB BF16 output buffer.  A fixed constant so output never depends on it
# (each tensor's stream is consumed in the same order regardless).
CHUNK_ELEMS = 1 << 23

PRESETS = {
    # The project's "large generated model".  These are also the defaults.
    "large": dict(hidden=1024, layers=16, heads=16, kv_heads=4, head_dim=64,
                  experts=64, top_k=8, moe_inter=512, vocab=151936,
                  tie_embeddings=False),
    # A fast variant for tests: same layout (separate lm_head, q width
    # heads*head_dim = 128 != hidden 64), about 42 MB.  The vocabulary stays
    # the real Qwen3 one so the copied tokenizer is valid; it dominates size.
    "small": dict(hidden=64, layers=4, heads=4, kv_heads=2, head_dim=32,
                  experts=16, top_k=4, moe_inter=128, vocab=151936,
                  tie_embeddings=False),
    # The routing shape of DeepSeek-V2-Lite (26 MoE layers, 64 routed
    # experts, top-6, 2 shared experts) in Qwen2-MoE layout.  moe_inter:
    # V2-Lite's 1408 scaled like hidden (1408 * 256/2048 = 176) and
    # rounded up to 192, the next multiple of the MXFP4 block (32), so
    # the experts convert to MXFP4.  V2-Lite's 2 shared experts are, as
    # in DeepSeek's own code, one MLP of 2 x moe_inter = 384; Qwen2-MoE
    # adds a sigmoid gate on it that V2-Lite lacks.  V2-Lite's dense
    # first layer and MLA attention are not generated.
    "dsv2lite-shape": dict(family="qwen2_moe", hidden=256, layers=26,
                           heads=8, kv_heads=2, head_dim=32, experts=64,
                           top_k=6, moe_inter=192, shared_inter=384,
                           vocab=151936, tie_embeddings=False),
}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json",
                   "generation_config.json")


def log(msg):
    sys.stderr.write("gen-moe-model: " + msg + "\n")
    sys.stderr.flush()


SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10 ** 3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10 ** 6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10 ** 9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10 ** 12,
}


def parse_size(text):
    """'2GiB', '1.5G', '500MB', '65536' -> bytes, as st_parse_size reads them:
    k/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, kB/MB/GB/TB of 1000."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if unit not in SIZE_UNITS:
        raise argparse.ArgumentTypeError("not a size: %r" % text)
    value = int(float(m.group(1)) * SIZE_UNITS[unit] + 0.5)
    if value <= 0:
        raise argparse.ArgumentTypeError("size must be positive: %r" % text)
    return value


def tensor_seed(seed, name):
    digest = hashlib.sha256(("%d:%s" % (seed, name)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def plan_tensors(a):
    """List of (name, shape, kind, param) in writing order.

    kind: 'normal' -> N(0, param^2); 'norm' -> mean + std N(0,1), param =
    (mean, std).
    """
    h, hd = a.hidden, a.head_dim
    qwen2 = a.family == "qwen2_moe"
    q_out, kv_out = a.heads * hd, a.kv_heads * hd
    mat = lambda g, fan_in: ("normal", g / math.sqrt(fan_in))
    t = [("model.embed_tokens.weight", (a.vocab, h), "normal", 0.35)]
    for n in range(a.layers):
        p = "model.layers.%d." % n
        t.append((p + "input_layernorm.weight", (h,), "norm", (1.0, 0.2)))
        t.append((p + "self_attn.q_proj.weight", (q_out, h)) + mat(1.0, h))
        if qwen2:
            t.append((p + "self_attn.q_proj.bias", (q_out,), "normal", 0.1))
        t.append((p + "self_attn.k_proj.weight", (kv_out, h)) + mat(1.0, h))
        if qwen2:
            t.append((p + "self_attn.k_proj.bias", (kv_out,), "normal", 0.1))
        t.append((p + "self_attn.v_proj.weight", (kv_out, h)) + mat(1.0, h))
        if qwen2:
            t.append((p + "self_attn.v_proj.bias", (kv_out,), "normal", 0.1))
        t.append((p + "self_attn.o_proj.weight", (h, q_out)) + mat(1.0, q_out))
        if not qwen2:
            t.append((p + "self_attn.q_norm.weight", (hd,), "norm",
                      (1.4, 0.25)))
            t.append((p + "self_attn.k_norm.weight", (hd,), "norm",
                      (1.4, 0.25)))
        t.append((p + "post_attention_layernorm.weight", (h,), "norm",
                  (1.0, 0.2)))
        t.append((p + "mlp.gate.weight", (a.experts, h)) + mat(1.5, h))
        for e in range(a.experts):
            q = p + "mlp.experts.%d." % e
            t.append((q + "gate_proj.weight", (a.moe_inter, h)) + mat(1.0, h))
            t.append((q + "up_proj.weight", (a.moe_inter, h)) + mat(1.0, h))
            t.append((q + "down_proj.weight", (h, a.moe_inter))
                     + mat(1.0, a.moe_inter))
        if qwen2:
            q, s = p + "mlp.shared_expert.", a.shared_inter
            t.append((q + "gate_proj.weight", (s, h)) + mat(1.0, h))
            t.append((q + "up_proj.weight", (s, h)) + mat(1.0, h))
            t.append((q + "down_proj.weight", (h, s)) + mat(1.0, s))
            t.append((p + "mlp.shared_expert_gate.weight", (1, h))
                     + mat(1.0, h))
    t.append(("model.norm.weight", (h,), "norm", (1.0, 0.2)))
    if not a.tie_embeddings:
        t.append(("lm_head.weight", (a.vocab, h), "normal", 0.35))
    return t


def n_elems(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def plan_shards(tensors, shard_size):
    """Greedy, in order: a shard takes tensors while its data stays within
    shard_size; a tensor larger than shard_size gets a shard of its own."""
    shards, cur, cur_bytes = [], [], 0
    for t in tensors:
        nbytes = 2 * n_elems(t[1])
        if cur and cur_bytes + nbytes > shard_size:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(t)
        cur_bytes += nbytes
    if cur:
        shards.append(cur)
    return shards


def shard_header(shard, metadata):
    """safetensors header bytes (JSON padded with spaces to a multiple of 8,
    as the reference implementation does) for the tensors of one shard."""
    hdr = {"__metadata__": metadata}
    off = 0
    for name, shape, _, _ in shard:
        nbytes = 2 * n_elems(shape)
        hdr[name] = {"dtype": "BF16", "shape": list(shape),
                     "data_offsets": [off, off + nbytes]}
        off += nbytes
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    return text, off


def f32_to_bf16_bits(x, tmp, out):
    """float32 array x -> BF16 bit patterns in out (uint16, same length),
    rounding to nearest even: add 0x7FFF plus the lowest kept bit, then keep
    the upper 16 bits.  x is clobbered; tmp is uint32 scratch of the same
    length.  Only for finite x (NaN could round to Inf); the generator's
    draws are finite and small."""
    u = x.view(np.uint32)
    np.right_shift(u, 16, out=tmp)
    np.bitwise_and(tmp, 1, out=tmp)
    tmp += np.uint32(0x7FFF)
    u += tmp
    u >>= np.uint32(16)
    np.copyto(out, u, casting="unsafe")


class Bf16Writer:
    """Scratch buffers reused across tensors (no per-chunk allocation)."""

    def __init__(self):
        self.f32 = np.empty(CHUNK_ELEMS, np.float32)
        self.tmp = np.empty(CHUNK_ELEMS, np.uint32)
        self.out = np.empty(CHUNK_ELEMS, np.uint16)

    def write_tensor(self, f, seed, name, shape, kind, param):
        rng = np.random.default_rng(tensor_seed(seed, name))
        total = n_elems(shape)
        done = 0
        while done < total:
            n = min(CHUNK_ELEMS, total - done)
            x = self.f32[:n]
            rng.standard_normal(out=x, dtype=np.float32)
            if kind == "normal":
                x *= np.float32(param)
            else:
                mean, std = param
                x *= np.float32(std)
                x += np.float32(mean)
            o = self.out[:n]
            f32_to_bf16_bits(x, self.tmp[:n], o)
            f.write(memoryview(o).cast("B"))
            done += n


def write_config(a, path):
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "decoder_sparse_step": 1,
        "eos_token_id": 151645,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        # Width of a dense MLP; unused (every layer is MoE) but Qwen3-MoE
        # configs carry it.  Qwen3-30B-A3B has 6144 = 3 x hidden.
        "intermediate_size": 3 * a.hidden,
        "max_position_embeddings": 40960,
        "max_window_layers": a.layers,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": a.moe_inter,
        "norm_topk_prob": True,
        "num_attention_heads": a.heads,
        "num_experts": a.experts,
        "num_experts_per_tok": a.top_k,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv_heads,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": bool(a.tie_embeddings),
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": a.vocab,
    }
    for k in ("bos_token_id", "eos_token_id"):
        if cfg[k] >= a.vocab:  # a test-sized vocabulary: no such token
            del cfg[k]
    if a.family == "qwen2_moe":
        # configuration_qwen2_moe.py keys; no q/k norm, biased q/k/v
        # (qkv_bias absent = true), norm_topk_prob false as in
        # Qwen1.5-MoE-A2.7B
        cfg["architectures"] = ["Qwen2MoeForCausalLM"]
        cfg["model_type"] = "qwen2_moe"
        cfg["shared_expert_intermediate_size"] = a.shared_inter
        cfg["norm_topk_prob"] = False
        for k in ("head_dim", "attention_bias", "attention_dropout"):
            del cfg[k]
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def default_tokenizer_dir():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.normpath(os.path.join(repo, "..", "shared", "fixtures",
                                         "models", "tiny-qwen3moe"))


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="gen-moe-model.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write a random-weight Qwen3-MoE checkpoint "
                    "(config.json, BF16 safetensors, tokenizer files) in "
                    "Hugging Face layout, for strata's benchmarks and tests.",
        epilog="""presets (explicit options override a preset's values):
  large           the project's large generated model (the defaults):
                  hidden 1024, 16 layers, 16 heads x 64, 4 KV heads,
                  64 experts, top-8, moe-inter 512, vocab 151936;
                  ~1.96 G parameters, ~3.9 GB
  small           fast variant for tests: hidden 64, 4 layers, 4 heads x 32,
                  2 KV heads, 16 experts, top-4, moe-inter 128, vocab 151936;
                  ~21 M parameters, ~42 MB
  dsv2lite-shape  DeepSeek-V2-Lite's routing shape in Qwen2-MoE layout:
                  26 layers, 64 routed experts, top-6, 2 shared experts
                  (one shared MLP of 2 x 192 = 384, sigmoid-gated as
                  Qwen2-MoE does), hidden 256, 8 heads x 32, 2 KV heads,
                  moe-inter 192 (V2-Lite's 1408 scaled to hidden 256 is
                  176, rounded up to a multiple of the MXFP4 block 32);
                  ~0.34 G parameters.  V2-Lite's dense first layer and MLA
                  attention are NOT generated.

weights: matrices N(0, (g/sqrt(fan_in))^2) with g 1.0 (router 1.5),
embeddings and lm_head N(0, 0.35^2), RMSNorm weights 1 + 0.2 N(0,1),
q_norm/k_norm 1.4 + 0.25 N(0,1); each tensor seeded from
sha256("<seed>:<name>"), so output is deterministic for a seed.

example:
  /usr/bin/python3 scripts/gen-moe-model.py --out /tmp/big
  /usr/bin/python3 scripts/gen-moe-model.py --preset small --out /tmp/small
""")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory (created if absent)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="large",
                   help="size preset (default: large)")
    d = PRESETS["large"]
    p.add_argument("--family", choices=("qwen3_moe", "qwen2_moe"),
                   help="layout: qwen3_moe (default; q/k norm, no shared "
                        "expert) or qwen2_moe (q/k/v biases, one shared "
                        "expert with a sigmoid gate)")
    p.add_argument("--shared-inter", type=int,
                   help="shared_expert_intermediate_size (qwen2_moe; "
                        "default 2 x moe-inter)")
    p.add_argument("--hidden", type=int, help="hidden_size (large: %d)"
                   % d["hidden"])
    p.add_argument("--layers", type=int, help="num_hidden_layers (large: %d)"
                   % d["layers"])
    p.add_argument("--heads", type=int,
                   help="num_attention_heads (large: %d)" % d["heads"])
    p.add_argument("--kv-heads", type=int,
                   help="num_key_value_heads (large: %d)" % d["kv_heads"])
    p.add_argument("--head-dim", type=int, help="head_dim (large: %d)"
                   % d["head_dim"])
    p.add_argument("--experts", type=int, help="num_experts (large: %d)"
                   % d["experts"])
    p.add_argument("--top-k", type=int,
                   help="num_experts_per_tok (large: %d)" % d["top_k"])
    p.add_argument("--moe-inter", type=int,
                   help="moe_intermediate_size (large: %d)" % d["moe_inter"])
    p.add_argument("--vocab", type=int, help="vocab_size (large: %d)"
                   % d["vocab"])
    tie = p.add_mutually_exclusive_group()
    tie.add_argument("--tie-embeddings", dest="tie_embeddings",
                     action="store_true", default=None,
                     help="tie lm_head to embed_tokens (no lm_head.weight)")
    tie.add_argument("--no-tie-embeddings", dest="tie_embeddings",
                     action="store_false",
                     help="write a separate lm_head.weight (the default)")
    p.add_argument("--seed", type=int, default=20260101,
                   help="random seed (default 20260101)")
    p.add_argument("--shard-size", type=parse_size, default=2 << 30,
                   metavar="SIZE",
                   help="largest data size of one safetensors file, e.g. "
                        "2GiB, 500MB, 65536 (default 2GiB); a tensor larger "
                        "than SIZE gets a file of its own")
    p.add_argument("--tokenizer-from", metavar="DIR",
                   default=default_tokenizer_dir(),
                   help="copy %s from DIR (default: %s)"
                   % (", ".join(TOKENIZER_FILES), default_tokenizer_dir()))
    p.add_argument("--no-tokenizer", action="store_true",
                   help="do not copy tokenizer files")
    p.add_argument("--force", action="store_true",
                   help="replace an existing checkpoint in --out")
    a = p.parse_args(argv)

    explicit_shared = a.shared_inter is not None
    for k, v in PRESETS[a.preset].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.family is None:
        a.family = "qwen3_moe"
    if explicit_shared and a.family != "qwen2_moe":
        p.error("--shared-inter needs --family qwen2_moe (Qwen3-MoE has "
                "no shared expert)")
    if a.shared_inter is None or a.family != "qwen2_moe":
        a.shared_inter = 2 * a.moe_inter
    if a.family == "qwen2_moe" and a.heads * a.head_dim != a.hidden:
        p.error("qwen2_moe has no head_dim key: --heads x --head-dim "
                "(%d x %d) must equal --hidden (%d)"
                % (a.heads, a.head_dim, a.hidden))
    for k in ("hidden", "layers", "heads", "kv_heads", "head_dim", "experts",
              "top_k", "moe_inter", "vocab", "shared_inter"):
        if getattr(a, k) <= 0:
            p.error("--%s must be positive" % k.replace("_", "-"))
    if a.heads % a.kv_heads:
        p.error("--heads (%d) must be a multiple of --kv-heads (%d)"
                % (a.heads, a.kv_heads))
    if a.top_k > a.experts:
        p.error("--top-k (%d) exceeds --experts (%d)" % (a.top_k, a.experts))
    if a.head_dim % 2:
        p.error("--head-dim must be even (half-split RoPE)")
    return a


def existing_checkpoint(out):
    return [f for f in os.listdir(out)
            if re.fullmatch(r"model(-\d+-of-\d+)?\.safetensors(\.index\.json)?"
                            r"(\.tmp)?", f)]


def main(argv):
    a = parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    old = existing_checkpoint(a.out)
    if old:
        if not a.force:
            log("%s already holds a checkpoint (%s); use --force to replace "
                "it" % (a.out, old[0]))
            return 1
        for f in old:
            os.unlink(os.path.join(a.out, f))

    if not a.no_tokenizer:
        src = a.tokenizer_from
        if not os.path.isfile(os.path.join(src, "tokenizer.json")):
            log("no tokenizer.json in %s (use --tokenizer-from DIR or "
                "--no-tokenizer)" % src)
            return 1

    tensors = plan_tensors(a)
    total_params = sum(n_elems(t[1]) for t in tensors)
    shards = plan_shards(tensors, a.shard_size)
    n = len(shards)
    log("%d tensors, %.3f G parameters, %.2f GB BF16, %d file(s)"
        % (len(tensors), total_params / 1e9, 2 * total_params / 1e9, n))
    if a.vocab < 151669 and not a.no_tokenizer:
        log("warning: vocab %d is smaller than the Qwen3 tokenizer's 151669 "
            "ids; token ids may exceed the embedding" % a.vocab)
    for t in tensors:
        if 2 * n_elems(t[1]) > a.shard_size:
            log("warning: %s (%d bytes) exceeds --shard-size; it gets a file "
                "of its own" % (t[0], 2 * n_elems(t[1])))

    metadata = {"format": "pt", "generator": "strata gen-moe-model.py",
                "seed": str(a.seed)}
    names = ["model.safetensors"] if n == 1 else [
        "model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)]
    writer = Bf16Writer()
    t0 = time.time()
    done_params, last_report = 0, 0.0
    weight_map = {}
    for fname, shard in zip(names, shards):
        header, data_bytes = shard_header(shard, metadata)
        path = os.path.join(a.out, fname)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(header)))
            f.write(header)
            for name, shape, kind, param in shard:
                writer.write_tensor(f, a.seed, name, shape, kind, param)
                weight_map[name] = fname
                done_params += n_elems(shape)
                now = time.time()
                if now - last_report >= 2.0:
                    last_report = now
                    el = now - t0
                    log("%5.1f%%  %.2f / %.2f GB  %.0f s  (%s)"
                        % (100.0 * done_params / total_params,
                           2 * done_params / 1e9, 2 * total_params / 1e9,
                           el, name))
            if f.tell() != 8 + len(header) + data_bytes:
                raise AssertionError("size mismatch writing %s" % fname)
        os.replace(tmp, path)
        log("wrote %s (%d tensors, %d bytes)"
            % (fname, len(shard), 8 + len(header) + data_bytes))

    if n > 1:
        index = {"metadata": {"total_size": 2 * total_params},
                 "weight_map": weight_map}
        with open(os.path.join(a.out, "model.safetensors.index.json"),
                  "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")

    write_config(a, os.path.join(a.out, "config.json"))
    if not a.no_tokenizer:
        for fn in TOKENIZER_FILES:
            if fn == "generation_config.json" and a.vocab < 151669:
                continue  # its bos/eos ids lie outside a test vocabulary
            s = os.path.join(a.tokenizer_from, fn)
            if os.path.isfile(s):
                shutil.copyfile(s, os.path.join(a.out, fn))
            else:
                log("note: %s has no %s" % (a.tokenizer_from, fn))
    log("done in %.1f s: %s" % (time.time() - t0, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
