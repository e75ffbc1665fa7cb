#!/bin/sh
# test_gen_model.sh — checks scripts/gen-moe-model.py with an independent
# safetensors reader: every tensor of the Qwen3-MoE layout (MODEL_FAMILIES.md
# 4.2) is present with the right shape, dtype and byte length, offsets tile
# the data exactly, a sharded run has an index that covers every tensor and
# holds the same bytes as the single-file run, output is deterministic for a
# seed, and the weight statistics are the ones the generator documents.
#
# Skips (77) where /usr/bin/python3 lacks numpy or ../shared is absent,
# unless CI=true, where that is a failure.
set -u

skip() {
	if [ "${CI:-}" = "true" ]; then
		echo "FAIL: $1 (required under CI)" >&2
		exit 1
	fi
	echo "SKIP: $1" >&2
	exit 77
}

src=${STRATA_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
shared=${STRATA_SHARED_DIR:-$src/../shared}
py=/usr/bin/python3
gen=$src/scripts/gen-moe-model.py
tokdir=$shared/fixtures/models/tiny-qwen3moe

[ -x "$py" ] || skip "$py is absent"
"$py" -c 'import numpy' 2>/dev/null || skip "$py has no numpy"
[ -f "$tokdir/tokenizer.json" ] || skip "fixture $tokdir is absent"
[ -f "$gen" ] || { echo "FAIL: $gen is missing" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/strata-gen.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

shape="--hidden 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 16
       --experts 4 --top-k 2 --moe-inter 32 --vocab 1000"
run() {
	# shellcheck disable=SC2086
	"$py" "$gen" $shape --tokenizer-from "$tokdir" "$@" 2>"$tmp/log" || {
		cat "$tmp/log" >&2
		echo "FAIL: gen-moe-model.py $*" >&2
		exit 1
	}
}

run --seed 7 --out "$tmp/one"
run --seed 7 --out "$tmp/again"
run --seed 8 --out "$tmp/other"
# 20000 bytes per shard: the 128000-byte embedding and lm_head get files of
# their own, the layers split over several.
run --seed 7 --out "$tmp/sharded" --shard-size 20000
run --seed 7 --out "$tmp/tied" --tie-embeddings --shard-size 1MiB

# An existing checkpoint is not overwritten without --force.
if "$py" "$gen" $shape --tokenizer-from "$tokdir" --out "$tmp/one" \
	2>/dev/null; then
	echo "FAIL: overwrote an existing checkpoint without --force" >&2
	exit 1
fi
# A bad shape is refused.
if "$py" "$gen" --heads 6 --kv-heads 4 --out "$tmp/bad" 2>/dev/null; then
	echo "FAIL: accepted --heads 6 --kv-heads 4" >&2
	exit 1
fi

exec "$py" - "$tmp" "$tokdir" "$gen" <<'PYEOF'
import json, math, os, struct, sys
import numpy as np

tmp, tokdir = sys.argv[1], sys.argv[2]
H, L, NH, KV, HD, E, K, I, V = 64, 2, 4, 2, 16, 4, 2, 32, 1000
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)


def expected(tied):
    t = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
    if not tied:
        t["lm_head.weight"] = [V, H]
    for n in range(L):
        p = "model.layers.%d." % n
        t[p + "input_layernorm.weight"] = [H]
        t[p + "post_attention_layernorm.weight"] = [H]
        t[p + "self_attn.q_proj.weight"] = [NH * HD, H]
        t[p + "self_attn.k_proj.weight"] = [KV * HD, H]
        t[p + "self_attn.v_proj.weight"] = [KV * HD, H]
        t[p + "self_attn.o_proj.weight"] = [H, NH * HD]
        t[p + "self_attn.q_norm.weight"] = [HD]
        t[p + "self_attn.k_norm.weight"] = [HD]
        t[p + "mlp.gate.weight"] = [E, H]
        for e in range(E):
            q = p + "mlp.experts.%d." % e
            t[q + "gate_proj.weight"] = [I, H]
            t[q + "up_proj.weight"] = [I, H]
            t[q + "down_proj.weight"] = [H, I]
    return t


def read_st(path):
    """Independent safetensors reader: returns {name: float32 array}."""
    data = open(path, "rb").read()
    check(len(data) >= 8, path + ": shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    check(8 + n <= len(data), path + ": header runs past the end")
    hdr = json.loads(data[8:8 + n].decode("utf-8"))
    check(n % 8 == 0, path + ": header length %d not a multiple of 8" % n)
    meta = hdr.pop("__metadata__", None)
    check(isinstance(meta, dict) and meta.get("format") == "pt",
          path + ": __metadata__.format is not 'pt'")
    body = data[8 + n:]
    spans, out = [], {}
    for name, e in hdr.items():
        check(e.get("dtype") == "BF16", name + ": dtype " + str(e.get("dtype")))
        a, b = e["data_offsets"]
        want = 2 * math.prod(e["shape"])
        check(b - a == want, "%s: %d bytes for shape %s" % (name, b - a,
                                                            e["shape"]))
        spans.append((a, b, name))
        u = np.frombuffer(body[a:b], np.uint16).astype(np.uint32) << 16
        out[name] = (u.view(np.float32).reshape(e["shape"]), e["shape"])
    spans.sort()
    pos = 0
    for a, b, name in spans:
        check(a == pos, "%s: starts at %d, expected %d (gap or overlap)"
              % (name, a, pos))
        pos = b
    check(pos == len(body), path + ": data is %d bytes, tensors cover %d"
          % (len(body), pos))
    return out


def read_dir(d):
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    idx_path = os.path.join(d, "model.safetensors.index.json")
    tensors, where = {}, {}
    for f in files:
        for name, v in read_st(os.path.join(d, f)).items():
            check(name not in tensors, name + ": in two files")
            tensors[name] = v
            where[name] = f
    index = json.load(open(idx_path)) if os.path.exists(idx_path) else None
    return files, tensors, where, index


def check_shapes(tensors, tied, label):
    exp = expected(tied)
    check(set(tensors) == set(exp), "%s: tensor names differ: missing %s, "
          "extra %s" % (label, sorted(set(exp) - set(tensors))[:5],
                        sorted(set(tensors) - set(exp))[:5]))
    for name, shp in exp.items():
        if name in tensors:
            check(tensors[name][1] == shp, "%s: %s shape %s, expected %s"
                  % (label, name, tensors[name][1], shp))
            check(bool(np.isfinite(tensors[name][0]).all()),
                  "%s: %s has non-finite values" % (label, name))


# Single file.
files, one, _, index = read_dir(os.path.join(tmp, "one"))
check(files == ["model.safetensors"], "one: files %s" % files)
check(index is None, "one: unexpected index for a single file")
check_shapes(one, False, "one")

# Weight statistics (documented in the generator's --help).  Tolerances are
# about 4 standard errors for the number of samples drawn.
def stat(name):
    x = one[name][0].astype(np.float64)
    return x.mean(), x.std(), x.size

m, s, n = stat("model.embed_tokens.weight")
check(abs(s - 0.35) < 0.35 * 4 / math.sqrt(2 * n) + 0.004 and abs(m) < 0.01,
      "embed_tokens: mean %.4f std %.4f, expected 0 / 0.35" % (m, s))
allexp = np.concatenate([one["model.layers.%d.mlp.experts.%d.up_proj.weight"
                             % (l, e)][0].ravel()
                         for l in range(L) for e in range(E)])
check(abs(allexp.std() - 1 / 8) < 0.004,
      "up_proj std %.4f, expected 1/sqrt(64) = 0.125" % allexp.std())
gates = np.concatenate([one["model.layers.%d.mlp.gate.weight" % l][0].ravel()
                        for l in range(L)])
check(abs(gates.std() - 1.5 / 8) < 0.02,
      "router std %.4f, expected 1.5/8 = 0.1875" % gates.std())
qn = np.concatenate([one["model.layers.%d.self_attn.%s_norm.weight" % (l, w)]
                     [0] for l in range(L) for w in "qk"])
check(abs(qn.mean() - 1.4) < 0.15, "q/k norm mean %.3f, expected 1.4"
      % qn.mean())
ln = np.concatenate([one["model.layers.%d.input_layernorm.weight" % l][0]
                     for l in range(L)])
check(abs(ln.mean() - 1.0) < 0.12 and abs(ln.std() - 0.2) < 0.08,
      "input_layernorm mean %.3f std %.3f, expected 1 / 0.2"
      % (ln.mean(), ln.std()))
# Every value is exactly a BF16 value (low 16 bits zero after widening is
# guaranteed by the reader); distinct tensors are not copies of each other.
check(not np.array_equal(one["model.embed_tokens.weight"][0],
                         one["lm_head.weight"][0]),
      "lm_head equals embed_tokens although untied")

# Values: regenerate one tensor from the documented seeding
# (default_rng(first 8 bytes LE of sha256("<seed>:<name>")), N(0,1) float32
# times 0.35 for the embedding) and round to BF16 here by comparing the two
# neighbouring BF16 values (ties to the even one): must match bit for bit.
import hashlib
name = "model.embed_tokens.weight"
sd = int.from_bytes(hashlib.sha256(("7:" + name).encode()).digest()[:8],
                    "little")
x = np.random.default_rng(sd).standard_normal(V * H, dtype=np.float32)
x *= np.float32(0.35)
u = x.view(np.uint32)
lo = (u & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
hi = ((u & np.uint32(0xFFFF0000)) + np.uint32(0x10000)).view(np.float32) \
    .astype(np.float64)
xd = x.astype(np.float64)
dlo, dhi = np.abs(xd - lo), np.abs(hi - xd)
lo_even = ((u >> 16) & 1) == 0
pick_lo = (dlo < dhi) | ((dlo == dhi) & lo_even)
want = np.where(pick_lo, lo, hi).astype(np.float32)
check(np.array_equal(want, one[name][0].ravel()),
      name + ": values differ from the documented generator + RNE rounding")

# The generator's rounding on hand-picked float32 bit patterns, against the
# expected BF16 bits worked out by hand: ties go to the even neighbour.
import importlib.util
spec = importlib.util.spec_from_file_location("gen", sys.argv[3])
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)
cases = [
    (0x3F800000, 0x3F80),  # 1.0 exact
    (0x3F808000, 0x3F80),  # 1 + 2^-8: tie, lsb 0 -> down
    (0x3F818000, 0x3F82),  # 1 + 3*2^-8: tie, lsb 1 -> up
    (0x3F808001, 0x3F81),  # just above the tie -> up
    (0x3F807FFF, 0x3F80),  # just below the tie -> down
    (0xBF818000, 0xBF82),  # negative tie, lsb 1 -> up in magnitude
    (0xBF808000, 0xBF80),  # negative tie, lsb 0 -> down in magnitude
    (0x3FFFFFFF, 0x4000),  # carry into the exponent
    (0x7F7FFFFF, 0x7F80),  # FLT_MAX rounds to +Inf (RNE overflow)
    (0x00000001, 0x0000),  # smallest subnormal -> +0
    (0x80000000, 0x8000),  # -0 stays -0
]
xs = np.array([c[0] for c in cases], np.uint32).view(np.float32).copy()
bits = np.empty(len(cases), np.uint16)
gen.f32_to_bf16_bits(xs, np.empty(len(cases), np.uint32), bits)
for (inp, want), got in zip(cases, bits):
    check(int(got) == want, "bf16(0x%08X) = 0x%04X, expected 0x%04X"
          % (inp, int(got), want))

# config.json
cfg = json.load(open(os.path.join(tmp, "one", "config.json")))
ref = json.load(open(os.path.join(tokdir, "config.json")))
# vocab 1000 holds no Qwen3 special token: the generator drops bos/eos
# (strata refuses ids outside the vocabulary) and keeps every other key
small_vocab = {"bos_token_id", "eos_token_id"}
check(set(cfg) == set(ref) - small_vocab,
      "config keys differ from the fixture's: %s"
      % sorted((set(ref) - small_vocab) ^ set(cfg)))
for k, v in {"architectures": ["Qwen3MoeForCausalLM"],
             "model_type": "qwen3_moe", "hidden_size": H,
             "num_hidden_layers": L, "num_attention_heads": NH,
             "num_key_value_heads": KV, "head_dim": HD, "num_experts": E,
             "num_experts_per_tok": K, "moe_intermediate_size": I,
             "vocab_size": V, "tie_word_embeddings": False,
             "norm_topk_prob": True, "torch_dtype": "bfloat16",
             "decoder_sparse_step": 1, "mlp_only_layers": []}.items():
    check(cfg.get(k) == v, "config %s = %r, expected %r" % (k, cfg.get(k), v))

# Tokenizer files copied byte for byte; not generation_config.json, whose
# eos ids lie outside the 1000-token vocabulary.
check(not os.path.exists(os.path.join(tmp, "one", "generation_config.json")),
      "generation_config.json copied into a 1000-token model")
for f in ("tokenizer.json", "tokenizer_config.json"):
    a = open(os.path.join(tokdir, f), "rb").read()
    p = os.path.join(tmp, "one", f)
    check(os.path.exists(p) and open(p, "rb").read() == a, f + " not copied")

# Determinism: same seed, same bytes; another seed, other values.
same = open(os.path.join(tmp, "one", "model.safetensors"), "rb").read() == \
    open(os.path.join(tmp, "again", "model.safetensors"), "rb").read()
check(same, "seed 7 twice gave different files")
_, other, _, _ = read_dir(os.path.join(tmp, "other"))
check(not np.array_equal(other["model.layers.1.mlp.gate.weight"][0],
                         one["model.layers.1.mlp.gate.weight"][0]),
      "seeds 7 and 8 gave the same router")

# Sharded: the index covers every tensor, each tensor is in the file the
# index names, each file's data fits the shard size unless it holds a single
# larger tensor, and the bytes equal the single-file run.
files, sh, where, index = read_dir(os.path.join(tmp, "sharded"))
check_shapes(sh, False, "sharded")
check(len(files) > 2, "sharded: only %d files" % len(files))
for i, f in enumerate(files):
    check(f == "model-%05d-of-%05d.safetensors" % (i + 1, len(files)),
          "sharded: file name " + f)
check(index is not None, "sharded: no model.safetensors.index.json")
if index is not None:
    wm = index.get("weight_map", {})
    check(set(wm) == set(expected(False)), "index weight_map names differ")
    check(all(wm.get(n) == where.get(n) for n in sh),
          "index names the wrong file for some tensor")
    total = sum(2 * math.prod(v[1]) for v in sh.values())
    check(index.get("metadata", {}).get("total_size") == total,
          "index total_size %r, expected %d"
          % (index.get("metadata", {}).get("total_size"), total))
for f in files:
    names = [n for n in sh if where[n] == f]
    size = sum(2 * math.prod(sh[n][1]) for n in names)
    check(size <= 20000 or len(names) == 1,
          "%s: %d bytes in %d tensors exceeds the shard size"
          % (f, size, len(names)))
for n in one:
    if n in sh:
        check(np.array_equal(one[n][0], sh[n][0]),
              n + ": sharded bytes differ from the single file")

# Tied: no lm_head, config says so.
files, tied, _, index = read_dir(os.path.join(tmp, "tied"))
check_shapes(tied, True, "tied")
check(json.load(open(os.path.join(tmp, "tied", "config.json")))
      ["tie_word_embeddings"] is True, "tied: config not tied")

for f in fails:
    print("FAIL:", f, file=sys.stderr)
print("gen-moe-model: %d checks failed" % len(fails))
sys.exit(1 if fails else 0)
PYEOF
