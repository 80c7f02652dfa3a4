"""A Hugging Face Trainer job (tiny GPT-2 from config, offline) instrumented by trainwreck's
HF adapter: `trainwreck run --cmd "python hf_trainer.py" --world-sizes 2`.
    python hf_trainer.py [--steps 12] [--save-every 3] [--global-batch 8 | --per-device 4]
It always resumes from the newest checkpoint-N in its output directory (get_last_checkpoint).
--global-batch keeps the global batch fixed when the world size changes (per device = it / world
size); --per-device keeps the per-device batch fixed instead (the global batch then changes)."""
import argparse
import gc
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator
from transformers.trainer_utils import get_last_checkpoint

from trainwreck.trainer.frameworks.hf import TrainwreckHF

parser = argparse.ArgumentParser()
parser.add_argument("--run-dir"), parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--save-every", type=int, default=3)
parser.add_argument("--global-batch", type=int, default=8)
parser.add_argument("--per-device", type=int, help="a fixed per-device batch instead of a fixed global batch")
parser.add_argument("--dropout", type=float, default=0.1, help="GPT-2's dropout probabilities (0.1 is its default)")
cli = parser.parse_args()
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


class Tokens(torch.utils.data.Dataset):
    """64 fixed random token sequences (the same on every rank)."""

    def __init__(self) -> None:
        self.ids = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


tw = TrainwreckHF.from_env(cli.run_dir)
args = TrainingArguments(
    output_dir=tw.checkpoint_dir(), max_steps=cli.steps,
    per_device_train_batch_size=cli.per_device or cli.global_batch // WORLD,
    save_strategy="steps", save_steps=cli.save_every, report_to=[], use_cpu=True,
    logging_strategy="steps", logging_steps=1,  # the Trainer's global loss of every update (the adapter's `step`)
    ddp_backend="gloo", dataloader_drop_last=True, seed=0, disable_tqdm=True, learning_rate=1e-3)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                   resid_pdrop=cli.dropout, embd_pdrop=cli.dropout, attn_pdrop=cli.dropout))
trainer = Trainer(model=model, args=args, train_dataset=tw.dataset(Tokens()),
                  data_collator=tw.collator(default_data_collator), callbacks=[tw.callback()])
last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
trainer.train(resume_from_checkpoint=last)
# The Trainer leaves the process group to the interpreter's teardown, where gloo's threads were
# destroyed still running and a rank aborted at exit (-6) now and then: free the trainer (its DDP
# model holds the group through reference cycles), then destroy the group.
del trainer, model
gc.collect()
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
