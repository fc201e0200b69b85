#!/usr/bin/env python3
"""napkin against Hugging Face transformers from the same weights: logits, 20 AdamW steps, the weights' round trip.

Run with the bench venv (bash bench/peers/setup.sh installs transformers and safetensors into it):
    ~/.cache/napkin/bench-venv/bin/python bench/hf_parity.py [--only llama,gpt2] [--write-fixtures]

For each family, in fp32 at small dims (the models' own files with --dims, their precision set to fp32 and
their optimizer to a constant-lr AdamW for the run):
  llama     models/llama.yaml      against LlamaForCausalLM  (grouped-query attention: kv_heads < heads)
  llama3    models/llama3-8b.yaml  against LlamaForCausalLM with rope_type llama3 (Llama 3.1's scaled frequencies)
  gpt2      models/gpt2-124m.yaml  against GPT2LMHeadModel   (tied embeddings, Conv1D weights)
  mixtral   models/moe.yaml        against MixtralForCausalLM (top-2 of 4 experts at capacity factor E/k, so
                                   nothing is dropped; the load-balancing loss in both, coefficient 0.02)
the script
  1. builds the transformers model from a config (its own seeded init) and saves it with save_pretrained
     (model.safetensors; also in bf16, and sharded, for the import checks);
  2. imports it: napkin hf import MODEL HF_DIR -o init.safetensors;
  3. logits: napkin sample --logits on a prompt against transformers' forward on the same ids
     (max |napkin - hf| / max |hf|, at most 1e-5);
  4. trains 20 AdamW steps from those weights on the same batches: napkin's trainer (--init) against
     torch.optim.AdamW on the transformers model (relative loss difference at every step at most 1e-4);
  5. round trip: napkin hf export MODEL init.safetensors -o OUT: every tensor bit-equal to HF_DIR's, and
     from_pretrained(OUT) gives transformers' logits; the same in bf16 (--dtype bf16); the sharded checkpoint
     imports to the same napkin file as the single one.
--write-fixtures writes what CI checks offline (tests/e2e/hf_fixture_test.cpp) into tests/e2e/data/hf/FAMILY
for the --only families: config.json and model.safetensors (transformers' own files), prompt.txt (ids) and
logits.npy (transformers' logits on that prompt), at the dims in FIXTURE_DIMS; for mixtral also tokens.u16 and
train.json, transformers' losses over 20 AdamW steps on them.

Exit status 0 when every check passed, 1 otherwise.
"""
import argparse
import copy
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_vs_torch as tvt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAPKIN = os.path.join(ROOT, "build", "tools", "napkin")

STEPS = 20
LR = 1e-3
LOGITS_TOLERANCE = 1e-5
LOSS_TOLERANCE = 1e-4

# family -> (model file, napkin --dims, no_decay globs of its YAML applied to the transformers names)
FAMILIES = {
    "llama": ("models/llama.yaml", dict(batch=4, seq=32, vocab=256, d=64, heads=4, kv_heads=2, hidden=128, layers=2)),
    "llama3": ("models/llama3-8b.yaml",
               dict(batch=2, seq=32, vocab=256, d=64, heads=4, kv_heads=2, hidden=128, layers=2)),
    "gpt2": ("models/gpt2-124m.yaml", dict(batch=4, seq=32, vocab=256, d=64, heads=4, layers=2)),
    # capacity_percent = 100 * experts / top_k: nothing is dropped, as transformers' dropless routing
    "mixtral": ("models/moe.yaml", dict(batch=4, seq=32, vocab=256, d=64, heads=4, kv_heads=2, experts=4, top_k=2,
                                        expert_hidden=96, capacity_percent=200, layers=2)),
}
# The CI fixtures: smaller still, so that the committed files stay near 100 KB.
FIXTURE_DIMS = {
    "llama": dict(batch=1, seq=16, vocab=256, d=32, heads=4, kv_heads=2, hidden=64, layers=2),
    "gpt2": dict(batch=1, seq=16, vocab=256, d=32, heads=4, layers=2),
    "mixtral": dict(batch=2, seq=16, vocab=256, d=32, heads=4, kv_heads=2, experts=4, top_k=2, expert_hidden=48,
                    capacity_percent=200, layers=2),
}
# The fixtures that also hold STEPS AdamW steps of transformers (train.json, tokens.u16) for CI to train against.
TRAIN_FIXTURES = ["mixtral"]
# models/moe.yaml's load-balancing coefficient (its loss: ... + 0.02 * moe_load_balance()), transformers'
# router_aux_loss_coef.
MIXTRAL_AUX_COEF = 0.02


def dims_text(dims):
    return ",".join(f"{k}={v}" for k, v in dims.items())


def run(cmd):
    """napkin, with bench/train_vs_torch.py's runner: a failure exits with its command and output's tail."""
    try:
        return tvt.run(cmd, cmd[1], timeout=1200)
    except tvt.NapkinError as e:
        sys.exit(str(e))


def read_model_yaml(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def yaml_value(text, key):
    """A dims entry's number from the model file (e.g. rope_theta), for the transformers config."""
    m = re.search(rf"(?m)^\s+{key}:\s*([0-9.e+-]+)\s*$", text)
    return float(m.group(1)) if m else None


def parity_yaml(path, tmp, no_decay):
    """The model file with precision fp32 and a constant-lr AdamW (the torch side mirrors it)."""
    text = read_model_yaml(path)
    text = re.sub(r"(?m)^precision:.*$", "precision: fp32", text)
    globs = ", ".join(f'"{g}"' for g in no_decay)
    text = re.sub(r"(?m)^optimizer:.*$",
                  f"optimizer: adamw(lr={LR}, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1, grad_clip=1.0, "
                  f"no_decay=[{globs}])", text)
    out = os.path.join(tmp, os.path.basename(path))
    with open(out, "w") as f:
        f.write(text)
    return out


def hf_model(family, dims, text):
    """The transformers model of a family at napkin's dims, fp32, dropout off, its own seeded init."""
    import transformers as tf
    torch.manual_seed(0)
    if family.startswith("llama"):
        rope_scaling = None
        if family == "llama3":
            rope_scaling = {"rope_type": "llama3", "factor": yaml_value(text, "rope_factor"),
                            "low_freq_factor": yaml_value(text, "rope_low_freq_factor"),
                            "high_freq_factor": yaml_value(text, "rope_high_freq_factor"),
                            "original_max_position_embeddings": int(yaml_value(text, "rope_original_context"))}
        cfg = tf.LlamaConfig(vocab_size=dims["vocab"], hidden_size=dims["d"], intermediate_size=dims["hidden"],
                             num_hidden_layers=dims["layers"], num_attention_heads=dims["heads"],
                             num_key_value_heads=dims["kv_heads"], max_position_embeddings=dims["seq"],
                             rms_norm_eps=1e-5, rope_theta=yaml_value(text, "rope_theta"), rope_scaling=rope_scaling,
                             tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
        model = tf.LlamaForCausalLM(cfg)
    elif family == "mixtral":
        cfg = tf.MixtralConfig(vocab_size=dims["vocab"], hidden_size=dims["d"], intermediate_size=dims["expert_hidden"],
                               num_hidden_layers=dims["layers"], num_attention_heads=dims["heads"],
                               num_key_value_heads=dims["kv_heads"], max_position_embeddings=dims["seq"],
                               num_local_experts=dims["experts"], num_experts_per_tok=dims["top_k"],
                               rms_norm_eps=1e-5, rope_theta=yaml_value(text, "rope_theta"),
                               tie_word_embeddings=False, sliding_window=None, router_jitter_noise=0.0,
                               output_router_logits=True, router_aux_loss_coef=MIXTRAL_AUX_COEF)
        model = tf.MixtralForCausalLM(cfg)
    else:
        cfg = tf.GPT2Config(vocab_size=dims["vocab"], n_positions=dims["seq"], n_embd=dims["d"],
                            n_layer=dims["layers"], n_head=dims["heads"], activation_function="gelu_new",
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)
        model = tf.GPT2LMHeadModel(cfg)
    # Norm gains and biases start at 1 and 0 in both; draw them so that a swapped name shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.float().eval()


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def relative(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def napkin_logits(yaml, dims, ckpt, ids, tmp):
    prompt = os.path.join(tmp, "prompt.txt")
    with open(prompt, "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    out = os.path.join(tmp, "napkin-logits.npy")
    run([NAPKIN, "sample", yaml, "--dims", dims_text(dims), "--checkpoint", ckpt, "--prompt-ids", prompt,
         "--tokens", "1", "--temperature", "0", "--logits", out])
    return np.load(out)


def same_tensors(a_path, b_path):
    a, b = load_file(a_path), load_file(b_path)
    if sorted(a) != sorted(b):
        return f"names differ: {sorted(set(a) ^ set(b))}"
    for k in a:
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or raw(a[k]) != raw(b[k]):
            return f"{k} differs ({a[k].dtype}{list(a[k].shape)} vs {b[k].dtype}{list(b[k].shape)})"
    return None


def raw(t):
    """A tensor's bytes (bf16 included, which numpy cannot hold)."""
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def no_decay_of(family):
    """(napkin globs, the same selection on transformers' names)."""
    if family.startswith("llama"):
        return ["*norm*"], lambda n: "norm" in n
    if family == "mixtral":  # models/moe.yaml's no_decay; transformers calls the router mlp.gate
        return ["*norm*", "*router*"], lambda n: "norm" in n or n.endswith("mlp.gate.weight")
    return ["*_b", "*_g", "wpe"], lambda n: n.endswith(".bias") or ".ln_" in n or "wpe" in n


def train_both(family, yaml, dims, ckpt, model, tmp):
    """20 AdamW steps of napkin's trainer and of torch on the transformers model, same weights and batches."""
    B, T, V = dims["batch"], dims["seq"], dims["vocab"]
    rng = np.random.default_rng(1)
    # Twice the windows the steps read: a model whose data keeps a split for evaluation (llama.yaml's 0.9)
    # trains on the file's first part, which must hold every window so that no side wraps around.
    tokens = rng.integers(0, V, size=2 * B * T * STEPS + 1, dtype=np.uint16)
    data = os.path.join(tmp, "tokens.u16")
    tokens.tofile(data)
    metrics = os.path.join(tmp, "metrics.jsonl")
    run([NAPKIN, "train", yaml, "--dims", dims_text(dims), "--", "--init", ckpt, "--data", data, "--order",
         "sequential", "--steps", str(STEPS), "--log-every", "1", "--metrics", metrics, "--checkpoint-every", "0",
         "--quiet", "--seed", "0"])
    napkin = [json.loads(line)["loss"] for line in open(metrics) if '"loss"' in line and '"step"' in line]
    napkin = napkin[:STEPS]

    torch_losses = train_torch(family, model, tokens, dims)
    worst = max(abs(a - b) / abs(b) for a, b in zip(napkin, torch_losses))
    if worst > LOSS_TOLERANCE:
        print(f"{family}: napkin {napkin}\n{family}: torch  {torch_losses}")
    return napkin, torch_losses, worst


def train_torch(family, model, tokens, dims):
    """STEPS AdamW steps of torch on the transformers model over `tokens`, the windows napkin's trainer reads with
    --order sequential; the losses. The model is back in eval mode after, its weights trained."""
    B, T, V = dims["batch"], dims["seq"], dims["vocab"]
    _, decays = no_decay_of(family)
    params = dict(model.named_parameters())
    groups = [{"params": [p for n, p in params.items() if not decays(n)], "weight_decay": 0.1},
              {"params": [p for n, p in params.items() if decays(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95), eps=1e-8)
    model.train()
    torch_losses = []
    W = (len(tokens) - 1) // T
    for s in range(STEPS):
        starts = [((s * B + r) % W) * T for r in range(B)]
        x = torch.tensor(np.stack([tokens[a:a + T] for a in starts]).astype(np.int64))
        y = torch.tensor(np.stack([tokens[a + 1:a + T + 1] for a in starts]).astype(np.int64))
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.cross_entropy(out.logits.reshape(-1, V), y.reshape(-1))
        if family == "mixtral":  # transformers' own pooled load-balancing loss, as MixtralForCausalLM adds it
            loss = loss + MIXTRAL_AUX_COEF * out.aux_loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        torch_losses.append(loss.item())
    model.eval()
    return torch_losses


def check_family(family, tmp, results):
    path, dims = FAMILIES[family]
    text = read_model_yaml(path)
    globs, _ = no_decay_of(family)
    yaml = parity_yaml(path, tmp, globs)
    model = hf_model(family, dims, text)
    hf_dir = os.path.join(tmp, "hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    ckpt = os.path.join(tmp, "init.safetensors")
    run([NAPKIN, "hf", "import", yaml, hf_dir, "--dims", dims_text(dims), "-o", ckpt])

    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(0, dims["vocab"], size=dims["seq"])]
    ref = hf_logits(model, ids)
    got = napkin_logits(yaml, dims, ckpt, ids, tmp)
    err = relative(got, ref)
    results.append((family, "logits, imported weights (max |diff| / max |hf|)", err, err <= LOGITS_TOLERANCE))

    out = os.path.join(tmp, "export")
    run([NAPKIN, "hf", "export", yaml, ckpt, "--dims", dims_text(dims), "-o", out])
    diff = same_tensors(os.path.join(hf_dir, "model.safetensors"), os.path.join(out, "model.safetensors"))
    results.append((family, "HF -> napkin -> HF, f32: tensors bit-equal", diff or "equal", diff is None))
    import transformers as tf
    back = tf.AutoModelForCausalLM.from_pretrained(out).float().eval()
    err_back = relative(hf_logits(back, ids), ref)
    results.append((family, "from_pretrained(export) logits vs the original's", err_back, err_back == 0.0))

    bf16_dir, bf16_ckpt, bf16_out = (os.path.join(tmp, n) for n in ("hf-bf16", "bf16.safetensors", "export-bf16"))
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(bf16_dir, safe_serialization=True)
    run([NAPKIN, "hf", "import", yaml, bf16_dir, "--dims", dims_text(dims), "-o", bf16_ckpt])
    run([NAPKIN, "hf", "export", yaml, bf16_ckpt, "--dims", dims_text(dims), "--dtype", "bf16", "-o", bf16_out])
    diff = same_tensors(os.path.join(bf16_dir, "model.safetensors"), os.path.join(bf16_out, "model.safetensors"))
    results.append((family, "HF -> napkin -> HF, bf16: tensors bit-equal", diff or "equal", diff is None))

    sharded_dir, sharded_ckpt = os.path.join(tmp, "hf-sharded"), os.path.join(tmp, "sharded.safetensors")
    model.save_pretrained(sharded_dir, safe_serialization=True, max_shard_size="100KB")
    shards = len([f for f in os.listdir(sharded_dir) if f.endswith(".safetensors")])
    run([NAPKIN, "hf", "import", yaml, sharded_dir, "--dims", dims_text(dims), "-o", sharded_ckpt])
    a, b = load_file(ckpt), load_file(sharded_ckpt)
    same = sorted(a) == sorted(b) and all(raw(a[k]) == raw(b[k]) for k in a)
    results.append((family, f"sharded import ({shards} shards) equals the single file's", "equal" if same else "differ",
                    same))

    napkin, torch_losses, worst = train_both(family, yaml, dims, ckpt, model, tmp)
    print(f"{family}: losses napkin {napkin[0]:.6f} .. {napkin[-1]:.6f}, transformers {torch_losses[0]:.6f} .. "
          f"{torch_losses[-1]:.6f}")
    results.append((family, f"{STEPS} AdamW steps: worst relative loss difference", worst, worst <= LOSS_TOLERANCE))


def write_fixture(family, tmp):
    """tests/e2e/data/hf/FAMILY: transformers' files, a prompt and transformers' logits on it."""
    path, _ = FAMILIES[family]
    dims = FIXTURE_DIMS[family]
    model = hf_model(family, dims, read_model_yaml(path))
    out = os.path.join(ROOT, "tests", "e2e", "data", "hf", family)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    for extra in os.listdir(out):
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(out, extra))  # generation_config.json: not what the importer reads
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(0, dims["vocab"], size=dims["seq"])]
    with open(os.path.join(out, "prompt.txt"), "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    np.save(os.path.join(out, "logits.npy"), hf_logits(model, ids).astype(np.float32))
    with open(os.path.join(out, "dims.txt"), "w") as f:
        f.write(dims_text(dims) + "\n")
    if family in TRAIN_FIXTURES:
        # STEPS AdamW steps from these weights (the parity run's optimizer: constant lr LR), for the trainer.
        B, T, V = dims["batch"], dims["seq"], dims["vocab"]
        tokens = np.random.default_rng(1).integers(0, V, size=2 * B * T * STEPS + 1, dtype=np.uint16)
        tokens.tofile(os.path.join(out, "tokens.u16"))
        losses = train_torch(family, copy.deepcopy(model), tokens, dims)
        globs, _ = no_decay_of(family)
        with open(os.path.join(out, "train.json"), "w") as f:
            json.dump({"lr": LR, "no_decay": globs, "steps": STEPS, "losses": losses}, f, indent=1)
    print(f"wrote {out}: {sorted(os.listdir(out))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(FAMILIES), help="families, comma-separated")
    ap.add_argument("--write-fixtures", action="store_true", help="also write tests/e2e/data/hf/*")
    args = ap.parse_args()
    torch.set_num_threads(2)
    results = []
    for family in args.only.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            check_family(family, tmp, results)
    if args.write_fixtures:
        for family in (f for f in FIXTURE_DIMS if f in args.only.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                write_fixture(family, tmp)
    print(f"\n{'family':8} {'check':62} {'value':>14}  ok")
    for family, what, value, ok in results:
        shown = f"{value:.3g}" if isinstance(value, float) else str(value)
        print(f"{family:8} {what:62} {shown:>14}  {'yes' if ok else 'NO'}")
    return 0 if all(ok for *_, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
