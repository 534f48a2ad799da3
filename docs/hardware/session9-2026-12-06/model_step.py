"""A small language model's training steps on the GPU, built in code: gpuguard's registered-workload example.

--cpu-op   one operator (the MLP's GELU) computed on the CPU from the GPU's data and sent back: a silent fallback.
--steps N  timed steps (after 3 warm-ups); prints one gpuguard_result line.
"""
import json
import os
import sys
import tempfile
import time

import torch

args = sys.argv[1:]
cpu_op = "--cpu-op" in args
steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 30
dev = torch.device("cuda")
torch.manual_seed(0)
VOCAB, WIDTH, BATCH, SEQ = 8192, 512, 16, 256


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(WIDTH)
        self.attn = torch.nn.MultiheadAttention(WIDTH, 8, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(WIDTH)
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        h = self.up(self.ln2(x))
        h = torch.nn.functional.gelu(h.cpu()).to(dev) if cpu_op else torch.nn.functional.gelu(h)
        return x + self.down(h)


model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, WIDTH), *[Block() for _ in range(4)],
                            torch.nn.Linear(WIDTH, VOCAB)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
tokens = torch.randint(0, VOCAB, (BATCH, SEQ), device=dev)


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


for _ in range(3):
    step()
torch.cuda.synchronize()
started = time.perf_counter()
for _ in range(steps):
    loss = step()
torch.cuda.synchronize()
elapsed = time.perf_counter() - started
path = os.path.join(tempfile.gettempdir(), "tiny-lm.pt")
torch.save(model.state_dict(), path)
model.load_state_dict(torch.load(path))
os.unlink(path)
print(json.dumps({"gpuguard_result": {"samples_per_second": steps * BATCH / elapsed,
                                      "tokens_per_second": steps * BATCH * (SEQ - 1) / elapsed,
                                      "loss": float(loss)}}))
