#!/usr/bin/env bash
# Replay at scale: a ~125M-parameter GPT-2 from a config with random weights, 20 suspect steps and their
# control batches (2 same-bucket and 2 other-bucket per suspect, the fewest a z-score allows: 80 in all)
# replayed through two HF checkpoint folders in bf16 autocast with SDPA attention; prints tokens/s and
# model-FLOPs utilisation against the bf16 matmul ceiling measured on the same device. Then the segment re-run
# (``--rerun``) of one suspect from the middle checkpoint, given the optimizer state of one AdamW step: its time
# against the bare training steps it repeats (forward, backward, clip, step; best of 3), and the class it gives. One
# prepared script for a GPU machine, inside 5 minutes:
#
#   bash bench/replay_gpu.sh                      # cuda, 125M, bf16
#   bash bench/replay_gpu.sh --device cpu --tiny  # the same path on CPU with a 2-layer model (known to work first)
#
# Needs the [replay] extra (torch, transformers, safetensors). Writes its case to a temp folder (or --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
TINY=0
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --tiny) TINY=1; shift ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "replay_gpu.sh: unknown option $1 (expected --device D, --tiny, --out DIR)" >&2; exit 2 ;;
  esac
done
export PYTHONPATH="${PYTHONPATH:-}${PYTHONPATH:+:}$PWD"
DEVICE="$DEVICE" TINY="$TINY" OUT="$OUT" python3 - <<'PY'
import json, os, tempfile, time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import transformers

from forensics.replay import ReplayOptions, replay_case

device, tiny = os.environ["DEVICE"], os.environ["TINY"] == "1"
if device.startswith("cuda") and not torch.cuda.is_available():
    raise SystemExit("replay_gpu.sh: --device cuda but torch sees no CUDA device (use --device cpu --tiny)")
dtype = "bfloat16" if device.startswith("cuda") else "float32"
root = Path(os.environ["OUT"] or tempfile.mkdtemp(prefix="replay-gpu-"))
root.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
rng = np.random.default_rng(0)

# --- the model: GPT-2 small (124M) or a 2-layer toy, random weights, two checkpoint folders -------------------------
if tiny:
    cfg = transformers.GPT2Config(vocab_size=512, n_positions=256, n_embd=64, n_layer=2, n_head=2)
    max_len, budget, n_samples = 256, 2048, 1200
else:
    cfg = transformers.GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
    max_len, budget, n_samples = 1024, 16384, 6000
cfg.resid_pdrop = cfg.embd_pdrop = cfg.attn_pdrop = 0.0
model = transformers.GPT2LMHeadModel(cfg)
n_params = sum(p.numel() for p in model.parameters())

# --- a case: two length clusters, a static length-sorted plan under a token budget ----------------------------------
short = rng.integers(32, max_len // 4, n_samples // 2)
long_ = rng.integers(max_len // 2, max_len + 1, n_samples - n_samples // 2)
lengths = np.concatenate([short, long_])
toks = [rng.integers(0, cfg.vocab_size, n).tolist() for n in lengths]
samples = pd.DataFrame({"sample_id": np.arange(n_samples), "n_tokens": lengths.astype("int32"), "input_ids": toks,
                        "cluster": np.r_[np.zeros(len(short), int), np.ones(len(long_), int)]})
order = np.argsort(lengths, kind="stable")
batches, cur, width = [], [], 0
for i in order:
    w = max(width, int(lengths[i]))
    if cur and w * (len(cur) + 1) > budget:
        batches.append(cur); cur, w = [], int(lengths[i])
    cur.append(int(i)); width = w
batches.append(cur)
perm = rng.permutation(len(batches))
plan = pd.DataFrame([(s, int(i)) for s, b in enumerate(perm) for i in batches[b]], columns=["step", "sample_id"])
samples.to_parquet(root / "samples.parquet", index=False)
plan.to_parquet(root / "plan.parquet", index=False)
n_steps = len(batches)
mid = n_steps // 3
t0 = time.perf_counter()
for step in (0, mid):
    model.save_pretrained(root / f"checkpoint-{step}")
t_save = time.perf_counter() - t0
with open(root / "metrics.jsonl", "w") as f:
    for s in range(n_steps):
        f.write(json.dumps({"step": s, "train/loss": float(np.log(cfg.vocab_size))}) + "\n")
b = max_len // 2
(root / "run.toml").write_text(f'metrics = ["metrics.jsonl"]\nboundaries = [0, {b}, {max_len}]\nmax_len = {max_len}\n'
                               'checkpoints = "."\n')

# --- the bf16 (GPU) / fp32 (CPU) matmul ceiling of this device ------------------------------------------------------
n = 1024 if tiny else 8192
mm_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
a = torch.randn(n, n, device=device, dtype=mm_dtype)
bm = torch.randn(n, n, device=device, dtype=mm_dtype)
sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
for _ in range(3):
    a @ bm
sync()
reps = 10 if tiny else 50
t0 = time.perf_counter()
for _ in range(reps):
    a @ bm
sync()
ceiling = 2 * n ** 3 * reps / (time.perf_counter() - t0)
del a, bm

# --- replay: 20 suspects, 2 same-bucket + 2 other-bucket controls each ---------------------------------------------
steps = sorted(int(s) for s in rng.choice(np.arange(mid + 1, n_steps - 1), size=20, replace=False))
opts = ReplayOptions(steps=steps, controls=2, earlier=0, device=device, dtype=dtype, probes=False,
                     max_tokens_per_forward=budget)
# the figures below count every forward actually run (neighbours, calibration and the determinism re-run included)
sync()
t0 = time.perf_counter()
res = replay_case(root, opts)
sync()
wall = time.perf_counter() - t0
tps = res.tokens_forwarded / wall
# forward FLOPs per token: 2 per parameter plus attention (2 * layers * context * width, causal half of 4*L*T*d)
flops_tok = 2 * n_params + 2 * cfg.n_layer * max_len * cfg.n_embd
mfu = tps * flops_tok / ceiling
verdicts = pd.Series([d["verdict"] for d in res.steps]).value_counts().to_dict()
print(f"device {device} ({torch.cuda.get_device_name() if device.startswith('cuda') else 'cpu'}), dtype {dtype}, "
      f"attention {getattr(model.config, '_attn_implementation', '?')}")
print(f"model: GPT-2 {n_params / 1e6:.1f}M parameters; checkpoints written in {t_save:.1f} s")
print(f"replayed {sum(d.get('role') == 'suspect' for d in res.steps)} suspect steps and "
      f"{sum(d.get('role') == 'control' for d in res.steps)} clean control step, {res.forwards} forwards, "
      f"{res.tokens_forwarded:,} padded tokens "
      f"in {wall:.1f} s (model load, checkpoints and tables included)")
print(f"tokens/s: {tps:,.0f}")
print(f"matmul ceiling ({mm_dtype}): {ceiling / 1e12:.2f} TFLOP/s; replay achieves {tps * flops_tok / 1e12:.3f} "
      f"TFLOP/s = MFU {mfu:.1%}")
print(f"verdicts: {verdicts}")

# --- the segment re-run: optimizer state in the middle checkpoint, one suspect 3 steps after it ----------------------
from forensics.replay.batches import pad_batch

model.to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids, mask = pad_batch([np.asarray(toks[i]) for i in batches[perm[0]]], 0, "right")
with torch.autocast(device.split(":")[0], dtype=mm_dtype, enabled=dtype == "bfloat16"):
    model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=ids.to(device)).loss.backward()
opt.step()
opt.zero_grad(set_to_none=True)
torch.save(opt.state_dict(), root / f"checkpoint-{mid}" / "optimizer.pt")
model.save_pretrained(root / f"checkpoint-{mid}")
suspect = mid + 3
ropts = ReplayOptions(steps=[suspect], controls=2, earlier=0, device=device, dtype=dtype, probes=False,
                      max_tokens_per_forward=budget, rerun=True)
sync()
t0 = time.perf_counter()
rres = replay_case(root, ropts)
sync()
rerun_wall = time.perf_counter() - t0
rerun = next(d["rerun"] for d in rres.steps if d.get("rerun"))


def bare() -> float:
    """The segment's steps with nothing recorded: load the checkpoint's weights and optimizer, then per step one
    forward and backward of its batch (autocast as the replay), the clipping and the optimizer's step."""
    m = transformers.GPT2LMHeadModel.from_pretrained(root / f"checkpoint-{mid}").to(device)
    o = torch.optim.AdamW(m.parameters(), lr=1e-4)
    o.load_state_dict(torch.load(root / f"checkpoint-{mid}" / "optimizer.pt", weights_only=True))
    sync()
    t = time.perf_counter()
    for s in range(mid, suspect + 1):
        ids, mask = pad_batch([np.asarray(toks[i]) for i in plan.loc[plan.step == s, "sample_id"]], 0, "right")
        with torch.autocast(device.split(":")[0], dtype=mm_dtype, enabled=dtype == "bfloat16"):
            m(input_ids=ids.to(device), attention_mask=mask.to(device), labels=ids.to(device)).loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        o.step()
        o.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - t


bare_s = min(bare() for _ in range(3))
print(f"re-run of step {suspect} from checkpoint {mid} ({suspect - mid + 1} steps, two passes, the replaced batch, "
      f"per-sample gradients; replay of its batch included): {rerun_wall:.1f} s; bare steps {bare_s:.2f} s; "
      f"class {rerun.get('cause_class')}, reproduced {rerun.get('reproduced')}")
print(f"case at {root}")
PY
