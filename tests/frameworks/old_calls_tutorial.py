"""The DDP tutorial (multigpu_torchrun.py) instrumented with the probe calls documented before the
helpers: `start`, `restore`, `point`, `batch`, `step`, `saving`, `commit`, none given `path=`.
Its snapshot.pt is overwritten in place after every epoch. `--fixed` resumes after the epoch the
snapshot holds; without it the tutorial's own bug: it resumes *at* that epoch and runs it again.
Used by tests/frameworks/test_gpt_accum.py."""
import os, sys
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group
from trainwreck.trainer.probe import Probe, state_digest
probe = Probe.from_env()
torch.manual_seed(0)
FIX = "--fixed" in sys.argv


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]

class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model, self.train_data, self.optimizer = model, train_data, optimizer
        self.save_every, self.epochs_run, self.snapshot_path = save_every, 0, snapshot_path
        self.step = 0
        probe.start()
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"] + (1 if FIX else 0)
        self.step = self.epochs_run * len(self.train_data)
        probe.restore(self.step, os.path.basename(snapshot_path), state_digest(self.model, self.optimizer))

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        ids = list(self.train_data.sampler)
        bs = self.train_data.batch_size
        for i, (source, targets) in enumerate(self.train_data):
            self.step += 1
            probe.point("step_start", self.step)
            probe.batch(self.step, epoch, ids[i * bs:(i + 1) * bs])
            loss = self._run_batch(source, targets)
            probe.step(self.step, loss.item(), state_digest(self.model, self.optimizer))

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        with probe.saving(self.step, os.path.dirname(self.snapshot_path)):
            torch.save(snapshot, self.snapshot_path)
        probe.commit(self.step, os.path.basename(self.snapshot_path), state_digest(self.model, self.optimizer))

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.gpu_id == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)

def main():
    init_process_group(backend="gloo")
    dataset = MyTrainDataset(64)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(dataset, batch_size=8, pin_memory=False, shuffle=False, sampler=DistributedSampler(dataset))
    epochs = 4
    probe.write_run_json(dataset_size=64, global_batch=16, drop_last=False, total_steps=epochs * len(loader))
    path = os.path.join(os.environ.get("TRAINWRECK_RUN_DIR", "."), "checkpoints", "snapshot.pt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Trainer(model, loader, optimizer, 1, path).train(epochs)
    destroy_process_group()

main()
