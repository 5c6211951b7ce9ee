"""Shared by the plan tests: tiny models by registry name, and a plan of one with the activations traced."""

import optax
import pytest

import partitioning as pt
from partitioning.plan import activation_names, build_plan
from partitioning.train.state import abstract_train_state

B, T = 8, 16


@pytest.fixture(scope="session")
def batch_size() -> int:
    """The batch size of every plan and Trainer in the plan tests."""
    return B


@pytest.fixture(scope="session")
def seq_len() -> int:
    """The sequence length of every plan and Trainer in the plan tests."""
    return T


@pytest.fixture(scope="session")
def make_mlp():
    """make_mlp(**overrides): the registry's "mlp" (vocab 64, embed 32, mlp 256, layers 2)."""

    def _mlp(**kw):
        return pt.model.build_model("mlp", **({"vocab_size": 64, "embed": 32, "mlp": 256, "layers": 2} | kw))

    return _mlp


@pytest.fixture(scope="session")
def make_gpt():
    """make_gpt(**overrides): the registry's "gpt" (vocab 64, embed 32, heads 4, mlp 64, layers 2)."""

    def _gpt(**kw):
        return pt.model.build_model("gpt", **({"vocab_size": 64, "embed": 32, "heads": 4, "mlp": 64, "layers": 2} | kw))

    return _gpt


@pytest.fixture(scope="session")
def make_plan():
    """make_plan(model, mesh sizes, rules, tx=adamw, **build_plan options): the Plan, activations included."""

    def _plan(model, sizes, rules, tx=None, **kw):
        params, opt = abstract_train_state(model, tx or optax.adamw(1e-3), batch_size=B, seq_len=T)
        acts = activation_names(model, params, sizes, rules, batch_size=B, seq_len=T)
        return build_plan(params, opt, sizes, rules, activations=acts, **kw)

    return _plan
