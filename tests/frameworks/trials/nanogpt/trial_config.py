# trainwreck trial (issue 33): nanoGPT made tiny for CPU (2 gloo ranks, seconds a run).
# Passed to train.py as nanoGPT takes a config file: `python train.py trial_config.py`.
device = 'cpu'
dtype = 'float32'
compile = False
backend = 'gloo'
out_dir = 'out'
init_from = 'scratch'         # trainwreck runs add --init_from=resume (the same command every attempt)
eval_interval = 4             # nanoGPT saves its checkpoint at each evaluation
eval_iters = 2
log_interval = 1
always_save_checkpoint = True
n_layer = 1
n_head = 2
n_embd = 16
block_size = 8
dropout = 0.0
bias = False
batch_size = 2
gradient_accumulation_steps = 4   # 2 per rank on 2 ranks, 4 on 1: the global batch is fixed
learning_rate = 1e-2
max_iters = 11                # nanoGPT stops after iteration max_iters: 12 updates
warmup_iters = 2
lr_decay_iters = 12
min_lr = 1e-3
