"""The run shared by the multi-process workers and the single-process reference."""

import jax

import partitioning as pt
from partitioning.checkpoint import CheckpointManager
from partitioning.data.corpus import load_corpus
from partitioning.models import GPT
from partitioning.train import Trainer
from partitioning.train.optimizer import make_optimizer

STEPS = 4


def make_trainer(mesh):
    model = GPT(vocab_size=256, embed=32, heads=2, mlp=64, layers=2)
    tx = make_optimizer("adamw", lr=3e-3, warmup_steps=0, total_steps=STEPS)
    return Trainer(model, tx, mesh, "fsdp", batch_size=8, seq_len=32)


def losses_on(mesh, steps=STEPS):
    """Trains ``steps`` steps of the shared run on ``mesh``; returns the losses (host floats)."""
    trainer = make_trainer(mesh)
    state = trainer.init(jax.random.key(0))
    batches = load_corpus().batches("train", 8, 32, trainer.batch_sharding, seed=0)
    losses = []
    for step in range(steps):
        state, metrics = trainer.train_step(state, batches.batch_at(step))
        losses.append(float(metrics["loss"]))
    return losses


def losses_and_checkpoint(ckpt_dir=None):
    """Trains STEPS steps on 8 global devices; returns the losses (host floats)."""
    mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    trainer = make_trainer(mesh)
    state = trainer.init(jax.random.key(0))
    batches = load_corpus().batches("train", 8, 32, trainer.batch_sharding, seed=0)
    losses = []
    for step in range(STEPS):
        state, metrics = trainer.train_step(state, batches.batch_at(step))
        losses.append(float(metrics["loss"]))
    if ckpt_dir is not None:
        with CheckpointManager(f"{ckpt_dir}/ckpt", async_=True) as mngr:
            mngr.save(STEPS, state, force=True)
            mngr.wait()
    return losses
