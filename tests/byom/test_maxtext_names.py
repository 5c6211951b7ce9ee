"""MaxText's activation names (activation_batch, activation_embed, ...) under the presets: a rule table's
``follows`` lays each out as the name it follows, so a MaxText block compiles to the same collectives as the
same block written with the toolkit's own names."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.plan.coverage import rule_coverage
from partitioning.plan.hlo import collectives, summarize
from tests.byom.models.maxtext_block import MlpBlock

BATCH = {"inputs": jnp.ones((16, 8, 64)), "targets": jnp.zeros((16, 8, 64))}
MAXTEXT = ("activation_batch", "activation_length", "activation_embed")


def mse(y, b):
    return jnp.mean((y - b["targets"]) ** 2)


def all_gathers(names, rules):
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})
    trainer = pt.Trainer(MlpBlock(names=names), optax.sgd(0.1), mesh, rules, batch=BATCH, task=mse)
    return summarize(collectives(trainer.lower_train_step().compile().as_text())).get("all-gather", {})


def test_a_maxtext_block_gathers_only_its_weights_under_fsdp():
    fsdp = pt.Rules.preset("fsdp")
    maxtext, plain = all_gathers("maxtext", fsdp), all_gathers("plain", fsdp)
    assert maxtext == plain and maxtext["count"] == 4  # q, o, wi, wo; no activation is gathered
    # Without `follows` the activation names match nothing: the activations are constrained unsharded.
    bare = pt.Rules(list(fsdp))
    assert bare.resolve(MAXTEXT) == P(None, None, None)
    assert fsdp.resolve(MAXTEXT) == P(("data", "fsdp"), None, None)


@pytest.mark.parametrize("preset", ["fsdp", "fsdp_tp", "tp", "seq"])
def test_every_preset_lays_out_maxtext_names_as_its_own(preset):
    rules = pt.Rules.preset(preset)
    for maxtext, plain in [
        (MAXTEXT, ("batch", "length", "embed")),
        (("activation_batch", "activation_norm_length", "activation_mlp"), ("batch", "length", "mlp")),
        (
            ("activation_batch", "activation_length", "activation_heads", "activation_kv"),
            ("batch", "length", "heads", "kv"),
        ),
        (("activation_embed_and_logits_batch", "activation_length", "activation_vocab"), ("batch", "length", "vocab")),
    ]:
        assert rules.resolve(maxtext) == rules.resolve(plain), (preset, maxtext)


def test_flax_own_constraints_and_reports_see_follows():
    rules = pt.Rules.preset("fsdp")
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})
    with jax.set_mesh(mesh), pt.axis_rules(rules):
        assert nn.logical_to_mesh_axes(MAXTEXT) == P(("data", "fsdp"), None, None)  # MaxText calls Flax's
    d = rules.explain(MAXTEXT)[2]
    assert d.name == "activation_embed" and d.notes[0] == "'activation_embed' follows 'embed'"
    cov = rule_coverage([], rules, [MAXTEXT, ("activation_kv_length",)])
    # activation_kv_length follows nothing and fsdp has no `length` rule: unsharded, and said so, as for `length`.
    assert cov.uncovered == ["activation_kv_length", "activation_length"]


def test_follows_in_yaml_and_config_forms(write):
    f = write("r.yaml", "rules:\n  - [embed, fsdp]\nfollows: {hidden: embed}\n")
    assert pt.Rules.from_yaml(f).resolve(("hidden",)) == P("fsdp")
    both = pt.Rules.parse({"preset": "fsdp", "follows": {"hidden": "mlp"}})
    assert both.follows["hidden"] == "mlp" and both.follows["activation_embed"] == "embed"
    assert pt.Rules.parse(both.to_config()).follows == both.follows  # what run_dir/config.yaml writes back
    with pytest.raises(pt.ConfigError, match=r"unknown follows set 'maxtxt' \(known: activations\)"):
        pt.Rules.parse({"preset": "fsdp", "follows": "maxtxt"}, "c.yaml", {}, ("rules",))
