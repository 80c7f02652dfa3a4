"""A GPT trainer shaped like nanoGPT's train.py, without a DataLoader (docs/FRAMEWORKS.md,
"A script without a DataLoader", shows the probe's diff against the uninstrumented copy).

No DataLoader: every micro-batch is drawn inside the accumulation loop as random windows of one
token stream (sampling with replacement, from a data RNG the checkpoint saves). Tied input and
output embeddings. The global batch is fixed (MICRO micro-batches per update, split over the
ranks), so a resume on another world size takes the same updates. It resumes only when run with
`--init-from resume` and a checkpoint exists: the harness runs the same command every attempt.

    trainwreck run --cmd "python gpt_accum.py --init-from resume" --world-sizes 2,1 \\
        --plan '[{"id":"k1","kind":"kill","rank":0,"step":6}]'

`--reseed-data-on-resume` plants a bug: the data RNG is seeded afresh at resume instead of
restored, so the resumed updates draw the windows the first ones drew (coverage catches it)."""
import argparse, math, os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--init-from", choices=("scratch", "resume"), default="scratch")
p.add_argument("--max-iters", type=int, default=12), p.add_argument("--save-every", type=int, default=4)
p.add_argument("--reseed-data-on-resume", action="store_true")
args = p.parse_args()

BLOCK, VOCAB, WIDTH, MICRO, MICRO_BATCH = 8, 32, 16, 4, 2   # MICRO micro-batches of MICRO_BATCH windows an update
torch.manual_seed(1337)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
accum = MICRO // world                                       # this rank's micro-batches per update
data = torch.randint(VOCAB, (400,), generator=torch.Generator().manual_seed(0))
draws = torch.Generator().manual_seed(1337)                  # the data RNG: every rank draws the same windows
windows = torch.empty(0)


def get_batch(micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch `micro` of this rank: the update's first call draws all its windows (so the
    data RNG moves by one update's draws at any world size), each rank keeps its share."""
    global windows
    if micro == 0:
        windows = torch.randint(len(data) - BLOCK, (MICRO, MICRO_BATCH), generator=draws)
    ix = windows[rank * accum + micro]
    x = torch.stack([data[i:i + BLOCK] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + BLOCK] for i in ix])
    return x, y


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(BLOCK, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, 2, 2 * WIDTH, dropout=0.0, batch_first=True)
        self.blocks, self.ln_f = nn.TransformerEncoder(layer, 1), nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight                # weight tying, as nanoGPT does
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(BLOCK))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        logits = self.lm_head(self.ln_f(self.blocks(h, mask=self.mask, is_causal=True)))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
ckpt_path = "ckpt.pt"
iter_num = 0
if args.init_from == "resume" and os.path.exists(ckpt_path):   # the first attempt has nothing to resume
    checkpoint = torch.load(ckpt_path)
    model.load_state_dict(checkpoint["model"]), optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num = checkpoint["iter_num"]
    if not args.reseed_data_on_resume:
        draws.set_state(checkpoint["draws"])
ddp = DDP(model)


def get_lr(it: int) -> float:
    warmup = 2
    return 1e-2 * (it + 1) / warmup if it < warmup else 1e-3 + 0.5 * (1e-2 - 1e-3) * (
        1 + math.cos(math.pi * (it - warmup) / (args.max_iters - warmup)))


while iter_num < args.max_iters:
    for group in optimizer.param_groups:
        group["lr"] = get_lr(iter_num)
    total = 0.0
    for micro_step in range(accum):
        ddp.require_backward_grad_sync = micro_step == accum - 1
        X, Y = get_batch(micro_step)
        loss = ddp(X, Y) / accum
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num % args.save_every == 0 and rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num,
                    "draws": draws.get_state()}, ckpt_path)
dist.barrier()
del ddp
dist.destroy_process_group()
